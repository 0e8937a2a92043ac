"""KV cache accounting in tokens, allocated in whole pages (SGLang's token pool; page_size 1)."""

from __future__ import annotations


class KVPool:
    """A counter of KV tokens in use. Never over-committed: ``used <= capacity`` always holds."""

    __slots__ = ("capacity", "page_size", "used")

    def __init__(self, capacity_tokens: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if capacity_tokens < page_size:
            raise ValueError(
                f"kv capacity must hold at least one page ({page_size} tokens), got {capacity_tokens}"
            )
        self.page_size = page_size
        self.capacity = capacity_tokens - capacity_tokens % page_size
        self.used = 0

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def round_up(self, num_tokens: int) -> int:
        """Tokens reserved for ``num_tokens``: rounded up to whole pages."""
        p = self.page_size
        return -(-num_tokens // p) * p

    def alloc(self, num_tokens: int) -> None:
        """Reserve exactly ``num_tokens`` (a multiple of the page size). Caller checks ``free``."""
        assert num_tokens % self.page_size == 0, num_tokens
        assert 0 <= num_tokens <= self.free, (num_tokens, self.free)
        self.used += num_tokens

    def release(self, num_tokens: int) -> None:
        assert 0 <= num_tokens <= self.used, (num_tokens, self.used)
        self.used -= num_tokens
