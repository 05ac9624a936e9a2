"""Next-token choice per request: greedy, or temperature, top-k and top-p with a seeded generator;
for requests that ask, vLLM v1's logits processing (logit bias, min-tokens bans, a grammar's mask,
penalties) and logprobs, in vLLM's order. A row asking for none of these takes the plain path."""

from __future__ import annotations

import math

import torch

from tropical.core.sampling import SamplingParams, TokenLogprobs
from tropical.sched.step import SampleRow


def step_generator(params: SamplingParams, step: int, device: torch.device | str = "cpu"
                   ) -> torch.Generator | None:
    """The generator for a seeded request's ``step``-th token: a pure function of (seed, step), so the
    draw is the same whichever worker or process samples it (a migrated request keeps its stream)."""
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed((params.seed * 1_000_003 + step) % 2**63)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of logits [n, vocab]; each row uses its own params and generator."""
    if not len(params) == len(generators) == logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators")
    return [_sample_row(row, p, g) for row, p, g in zip(logits, params, generators, strict=True)]


def sample_rows(logits: torch.Tensor, rows: list[SampleRow]) -> tuple[list[int], dict[int, TokenLogprobs]]:
    """One token per row of logits [n, vocab] as ``rows`` ask, and the logprobs of the rows whose
    request asked for them (by seq id). Plain rows sample exactly as ``sample`` does."""
    if len(rows) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows, {len(rows)} sample rows")
    tokens, logprobs, device = [], {}, logits.device
    for row_logits, row in zip(logits, rows, strict=True):
        generator = step_generator(row.params, row.step, device)
        if row.plain:
            tokens.append(_sample_row(row_logits, row.params, generator))
            continue
        token, scored = _sample_processed(row_logits, row, generator)
        tokens.append(token)
        if scored is not None:
            logprobs[row.seq_id] = scored
    return tokens, logprobs


def position_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprobs]:
    """Each row of logits [n, vocab] scoring ``tokens[i]``: its logprob (log-softmax in float32),
    its rank (how many tokens are at least as likely, vLLM's count) and the ``top`` most likely."""
    logprobs = logits.float().log_softmax(-1)
    chosen = logprobs.gather(-1, torch.tensor(tokens, dtype=torch.long, device=logits.device)[:, None])
    ranks = (logprobs >= chosen).sum(-1).tolist()
    values, ids = torch.topk(logprobs, top, dim=-1) if top else (logprobs[:, :0], logprobs[:, :0].long())
    return [TokenLogprobs(token, value, rank, tuple(zip(top_ids, top_values, strict=True)))
            for token, value, rank, top_ids, top_values
            in zip(tokens, chosen[:, 0].tolist(), ranks, ids.tolist(), values.tolist(), strict=True)]


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.greedy:
        return int(logits.argmax())
    return _draw(_filtered(logits.float(), params), generator)


def _sample_processed(logits: torch.Tensor, row: SampleRow, generator: torch.Generator | None
                      ) -> tuple[int, TokenLogprobs | None]:
    """vLLM v1's order: the grammar's mask (its model runner applies it to the logits before the
    sampler), raw logprobs, logit bias and min-tokens bans, penalties, then greedy or temperature,
    top-k, top-p and a draw; processed logprobs come from the logits the token was chosen from."""
    params = row.params
    logits = logits.float()
    if row.allowed is not None:
        logits = logits.masked_fill(~grammar_mask(row.allowed, logits.shape[-1], logits.device), -math.inf)
    scored: torch.Tensor | None = None if params.processed_logprobs else logits
    logits = _bias_and_ban(logits, row)
    if params.penalized:
        logits = apply_penalties(logits, row.prompt, row.output, params)
    if params.greedy:
        token = int(logits.argmax())
        chosen_from = logits
    else:
        chosen_from = _filtered(logits, params)
        token = _draw(chosen_from, generator)
    if params.logprobs is None:
        return token, None
    scored = chosen_from if scored is None else scored
    return token, position_logprobs(scored[None], [token], params.logprobs)[0]


def _bias_and_ban(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """vLLM's logit-bias and min-tokens processors: add each token's bias, forbid the banned,
    unless that forbids every token a finished grammar still allows (its end of sequence):
    then the grammar wins, and the request ends short of ``min_tokens``."""
    vocab = logits.shape[-1]
    if row.params.logit_bias:
        ids, biases = zip(*row.params.logit_bias, strict=True)
        if max(ids) >= vocab:
            raise ValueError(f"logit_bias names token {max(ids)}, beyond the vocabulary of {vocab}")
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        logits = logits.index_add(0, index, torch.tensor(biases, dtype=logits.dtype, device=logits.device))
    banned = [t for t in row.banned if t < vocab]
    if not banned:
        return logits
    kept = logits.index_fill(0, torch.tensor(banned, dtype=torch.long, device=logits.device), -math.inf)
    return logits if row.allowed is not None and bool(torch.isneginf(kept).all()) else kept


def apply_penalties(logits: torch.Tensor, prompt: tuple[int, ...], output: tuple[int, ...],
                    params: SamplingParams) -> torch.Tensor:
    """vLLM's apply_penalties on one row: the repetition penalty divides the positive logits (and
    multiplies the others) of every token seen in the prompt or the output; the frequency penalty
    subtracts per occurrence in the output, the presence penalty once per token in it."""
    vocab = logits.shape[-1]
    counts = torch.bincount(torch.tensor(output, dtype=torch.long, device=logits.device), minlength=vocab)
    counts = counts[:vocab].to(logits.dtype)
    in_output = counts > 0
    if params.repetition_penalty != 1:
        seen = in_output.clone()
        seen[torch.tensor(prompt, dtype=torch.long, device=logits.device)] = True
        penalty = params.repetition_penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
    return logits - params.frequency_penalty * counts - params.presence_penalty * in_output.to(logits.dtype)


def grammar_mask(allowed: bytes, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The bool mask [vocab] of a TokenConstraint's bitmask (little-endian 32-bit words, bit
    ``i % 32`` of word ``i // 32`` for token ``i``); tokens past the mask's end are not allowed."""
    if len(allowed) % 4:
        raise ValueError(f"a token bitmask is whole 32-bit words, got {len(allowed)} bytes")
    words = torch.frombuffer(bytearray(allowed), dtype=torch.int32).to(device)
    bits = (words[:, None] >> torch.arange(32, dtype=torch.int32, device=device)) & 1
    mask = bits.flatten().bool()[:vocab]
    if mask.shape[0] < vocab:
        mask = torch.cat([mask, mask.new_zeros(vocab - mask.shape[0])])
    return mask


def _filtered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Float logits scaled by the temperature, then top-k and top-p applied (dropped: -inf)."""
    scaled = logits / params.temperature
    if params.top_k:
        scaled = _top_k(scaled, params.top_k)
    if params.top_p < 1:
        scaled = _top_p(scaled, params.top_p)
    return scaled


def _draw(filtered: torch.Tensor, generator: torch.Generator | None) -> int:
    probs = torch.softmax(filtered, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < threshold, -math.inf)


def _top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (always at least one)."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
