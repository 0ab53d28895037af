"""Anthropic's prompt-caching rules, as a simulator.

- A request is a sequence of blocks (system, then each message's content blocks);
  `cache_control` marks breakpoints (at most 4). A top-level `cache_control` (automatic
  caching) is a breakpoint on the last block.
- Each breakpoint whose prefix reaches the model's minimum cacheable length writes a
  cache entry for the prefix up to and including it.
- A breakpoint reads the longest prefix already cached that ends at it or at one of the
  19 block boundaries before it.
- Entries live 5 minutes, and a hit refreshes them.
- Billing: cache reads 0.1x, cache writes 1.25x, the rest 1x.

The fake Anthropic server of the tests reports usage with it, and the caching benchmark
prices whole conversations with it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from core.model.llm import approximate_tokens

LOOKBACK_BLOCKS = 20
# Sonnet 5.5's cache reads cost 0.05x its input since 7 October 2026 (Anthropic's release notes,
# read 2 December 2026: $0.10 instead of $0.20 a million); a 5-minute write 1.25x.
READ_PRICE, WRITE_PRICE = 0.05, 1.25


def count_tokens(text: str) -> int:
    """A text's tokens as core/model/llm.py's `approximate_tokens` counts them (about four
    characters a token in the Latin alphabet, one a Chinese or Japanese character), at least one."""
    return max(1, approximate_tokens(text))


# Claude's vision guide: an image costs about width x height / 750 tokens, once scaled within
# 1568 px and 1.15 megapixels (about 1,600 tokens at most); a PDF page about 1,500 to 3,000.
IMAGE_MAX_TOKENS = 1600
PDF_PAGE_TOKENS = 2000


def block_tokens(block: dict[str, Any]) -> int:
    """A content block's tokens: text by its length, a tool call and a tool result by their JSON
    (the API reads a call's input and a result's content as it reads text: an "é" as one
    character, not as its escape), images by their pixels, PDFs by their pages."""
    if block.get("type") == "tool":  # a tool's definition, as the JSON it is sent as
        return count_tokens(json.dumps(block["tool"], sort_keys=True, ensure_ascii=False))
    if block.get("type") in ("tool_use", "tool_result"):
        return count_tokens(json.dumps(block, sort_keys=True, ensure_ascii=False))
    if block.get("type") not in ("image", "document"):
        return count_tokens(str(block.get("text", "")))
    import base64
    import io

    data = base64.b64decode(block["source"]["data"])
    if block["type"] == "document":
        from core.media.kinds import pdf_pages

        return max(pdf_pages(data), 1) * PDF_PAGE_TOKENS
    from PIL import Image  # the benchmarks' and tests' own dependency (dev extra)

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
    return min(max(1, width * height // 750), IMAGE_MAX_TOKENS)


@dataclass(frozen=True)
class CacheUsage:
    input_tokens: int  # uncached
    cache_creation_input_tokens: int
    cache_read_input_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def cost(self) -> float:
        """Relative to billing every token at the base input price."""
        return (
            self.input_tokens
            + WRITE_PRICE * self.cache_creation_input_tokens
            + READ_PRICE * self.cache_read_input_tokens
        )


def request_blocks(body: dict[str, Any]) -> tuple[list[str], list[int]]:
    """The texts of a Messages API request's blocks, and which of them are breakpoints."""
    # The cache's order: tools, system, messages (a breakpoint on the system prompt caches the tools).
    blocks: list[dict[str, Any]] = [{"type": "tool", "tool": tool} for tool in body.get("tools", [])]
    system = body.get("system", [])
    blocks += [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
    for message in body.get("messages", []):
        content = message["content"]
        blocks += [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    texts = [json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True) for block in blocks]
    breakpoints = [index for index, block in enumerate(blocks) if "cache_control" in block]
    if "cache_control" in body and blocks and len(blocks) - 1 not in breakpoints:
        breakpoints.append(len(blocks) - 1)
    assert len(breakpoints) <= 4, "Anthropic refuses more than 4 breakpoints"
    return texts, breakpoints


@dataclass
class PromptCache:
    min_tokens: int = 1024
    ttl_s: float = 300.0
    entries: dict[str, float] = field(default_factory=dict)

    def request(self, body: dict[str, Any], now: float) -> CacheUsage:
        texts, breakpoints = request_blocks(body)
        tokens = [block_tokens(json.loads(text)) for text in texts]
        keys, cumulative, digest, running = [], [], hashlib.sha256(), 0
        for text, size in zip(texts, tokens, strict=True):
            digest.update(text.encode())
            keys.append(digest.hexdigest())
            running += size
            cumulative.append(running)
        total = running
        read_end = -1
        for breakpoint in breakpoints:
            for index in range(breakpoint, max(-1, breakpoint - LOOKBACK_BLOCKS), -1):
                if self.entries.get(keys[index], -1.0) >= now:
                    read_end = max(read_end, index)
                    break
        if read_end >= 0:
            self.entries[keys[read_end]] = now + self.ttl_s
        read = cumulative[read_end] if read_end >= 0 else 0
        written_end = read_end
        for breakpoint in breakpoints:
            if cumulative[breakpoint] >= self.min_tokens:
                self.entries[keys[breakpoint]] = now + self.ttl_s
                written_end = max(written_end, breakpoint)
        written = cumulative[written_end] - read if written_end > read_end else 0
        return CacheUsage(total - read - written, written, read)
