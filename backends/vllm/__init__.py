"""vLLM backend: our chunk policies and decode balancers steering vLLM's V1 scheduler.

vLLM runs unchanged; ``FastPPScheduler`` (``--scheduler-cls
fastpp.backends.vllm.scheduler.FastPPScheduler``) subclasses its V1 ``Scheduler`` and, before
each ``schedule()``, lets our policies choose the step's token budget and which decodes ride in
the microbatch about to launch. Its modules:

* ``settings``: what the launcher passes to the scheduler process (one JSON environment variable);
* ``tracked``: our record of one vLLM request, the ``RequestView`` policies read;
* ``adapter``: slots, parking, signals and records over vLLM's requests (no vLLM import, so it
  is tested without the engine);
* ``view``: the ``PolicyView`` over the adapter and vLLM's queues;
* ``scheduler``: the vLLM ``Scheduler`` subclass (imports vLLM);
* ``stage_times``: per-stage compute times from the workers (written by ``plugin``);
* ``plugin``: the ``vllm.general_plugins`` entry point (CPU fixes, stage timing);
* ``recorder``: the run folder (requests.jsonl, iterations.csv, summary.json, decisions.jsonl);
* ``launcher``: ``fastpp serve --backend vllm``: the ``vllm serve`` command line and environment.

Only ``scheduler`` and ``plugin`` import vLLM; they run in the engine's environment
(``scripts/engines/setup_vllm.sh``). docs/engines/vllm.md explains the design.
"""
