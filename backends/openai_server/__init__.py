"""OpenAI-compatible HTTP front end for an in-process engine (``fastpp serve``).

``protocol`` validates request bodies into plain fields (OpenAI-style 4xx errors naming the
field), ``detokenize`` turns token streams into text deltas, ``metrics`` renders Prometheus text,
``app`` holds the FastAPI routes and ``runner`` starts engine and server and stops both.
Needs the ``serve`` extra (fastapi, uvicorn).
"""
