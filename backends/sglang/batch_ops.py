"""The few operations on SGLang 0.5.23 batches the adapter needs: park, restore, read back.

Parking takes decodes out of a microbatch's running ``ScheduleBatch`` (``filter_batch``): their
``Req`` objects, KV pages and ``req_to_token`` rows stay allocated; only batch membership
changes. Restoring builds a decode batch from the parked ``Req`` objects and merges it into the
launching slot's running batch, the way SGLang's own ``_build_hisparse_decode_batch``
(scheduler.py) moves staged requests into decode: rows, sequence lengths and sampling info from
the requests, and each request's last token stashed in the ``future_map`` from which the next
decode reads its input ids.
"""

from __future__ import annotations

from typing import Any

from fastpp.policy_host import BatchFeatures


def park(batch: Any, reqs: list[Any]) -> None:
    """Take ``reqs`` out of ``batch`` (a running ScheduleBatch); they keep their KV."""
    if reqs:
        batch.filter_batch(reqs_to_exclude=reqs)
        batch.batch_is_full = False  # a request left: admission may resume


def restore(scheduler: Any, batch: Any, reqs: list[Any]) -> Any:
    """Merge ``reqs`` into ``batch`` and return the running batch to use (a new one when
    ``batch`` is empty: an empty ScheduleBatch has no sampling info to merge into)."""
    if not reqs:
        return batch
    new = build_decode_batch(scheduler, reqs)
    if batch.is_empty():
        new.batch_is_full = False
        return new
    batch.merge_batch(new)
    return batch


def build_decode_batch(scheduler: Any, reqs: list[Any]) -> Any:
    import torch
    from sglang.srt.managers.overlap_utils import RelayPayload
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    s = scheduler
    batch = ScheduleBatch.init_new(
        reqs=reqs,
        req_to_token_pool=s.req_to_token_pool,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        tree_cache=s.tree_cache,
        model_config=s.model_config,
        enable_overlap=s.enable_overlap,
        spec_algorithm=s.spec_algorithm,
    )
    device = s.device
    rows = [r.kv.req_pool_idx for r in reqs]
    batch.req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=device)
    batch.req_pool_indices_cpu = torch.tensor(rows, dtype=torch.int64)
    # KV held so far: every prompt and output token except the newest, which this decode feeds
    seq_lens = [len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs]
    batch.seq_lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    batch.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
    batch.orig_seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    batch.seq_lens_sum = sum(seq_lens)
    last = torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64, device=device)
    s.future_map.stash(batch.req_pool_indices, RelayPayload(bonus_tokens=last))
    batch.input_ids = None
    # per-request lists a running batch carries since its prefill (prepare_for_extend);
    # merge_batch concatenates them
    batch.multimodal_inputs = [r.multimodal_inputs for r in reqs]
    if batch.return_logprob:
        batch.top_logprobs_nums = [r.logprob.top_logprobs_num for r in reqs]
        batch.token_ids_logprobs = [list(r.origin_input_ids) for r in reqs]
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, s.model_config.vocab_size)
    return batch


def batch_contents(batch: Any) -> tuple[dict, BatchFeatures]:
    """What a launched ScheduleBatch carries, read from SGLang's own fields: a dict for the
    batches record (the forward mode, the prefill chunks as [rid, L_past, L_pre], the decode
    rids, and the features below) and its ``BatchFeatures`` (fastpp.policy_host), from the
    decodes' L_dec (prompt + generated tokens: the context the step attends over) and the
    chunks."""
    mode = batch.forward_mode
    is_extend = bool(mode is not None and mode.is_extend())
    decoding = {id(r) for r in (getattr(batch, "decoding_reqs", None) or [])} if is_extend else set()
    chunks: list[list] = []
    spans: list[tuple[int, int, bool]] = []
    decodes: list[str] = []
    dec_ctx: list[int] = []
    for i, r in enumerate(batch.reqs):
        if is_extend and id(r) not in decoding:
            past, n = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
            chunks.append([r.rid, past, n])
            # a chunk samples a token when it reaches the end of what the request must compute
            # (its prompt, plus the tokens generated before a retraction)
            spans.append((past, n, past + n >= len(r.origin_input_ids) + len(r.output_ids)))
        else:
            decodes.append(r.rid)
            dec_ctx.append(len(r.origin_input_ids) + len(r.output_ids))
    f = BatchFeatures.of(dec_ctx, spans)
    contents = {
        "mode": "extend" if is_extend else ("decode" if mode is not None and mode.is_decode() else str(mode)),
        "chunks": chunks,
        "decodes": decodes,
        "num_tokens": f.num_tokens,
        "num_prefill_tokens": f.num_prefill_tokens,
        "sum_past_x_pre": f.sum_past_x_pre,
        "sum_pre_sq": f.sum_pre_sq,
        "sum_dec_ctx": f.sum_dec_ctx,
        "num_sampled": f.num_sampled,
    }
    return contents, f
