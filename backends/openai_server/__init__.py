"""OpenAI-compatible HTTP front end for an in-process engine (``fastpp serve``).

``protocol`` validates request bodies into plain fields (OpenAI-style 4xx errors naming the
field), ``guard`` is the ASGI layer around every route (API key, JSON bodies, status counts, a
last-resort 500), ``generation`` turns engine events into text deltas, ``metrics`` exposes
/metrics through prometheus_client, ``app`` holds the FastAPI routes and ``runner`` starts
engine and server and stops both. Needs the ``serve`` extra.
"""
