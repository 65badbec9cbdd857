"""Population-batched greedy generation with a KV cache (Hugging Face causal language models).

One vmap over the individuals runs the whole decoding loop: each individual
decodes with its own perturbed weights and its own cache, in one batched pass
per step. Positions follow the attention mask (left padding), as Hugging
Face's generate computes them. There is no early stop (it would need the
values of every individual on the host); a sequence that emitted an end token
(``eos_token_id``, by default the model's generation config's) continues with
``pad_token_id``, as Hugging Face's generate pads finished rows.
"""

from __future__ import annotations

import torch
from torch import Tensor


def generate(pop, input_ids: Tensor, attention_mask: Tensor | None, *, seeds, sigma, max_new_tokens: int,
             antithetic: bool, eos_token_id, pad_token_id, per_individual: bool) -> Tensor:
    """per_individual: input_ids carry a leading population dim (the mask stays shared: Hugging Face
    models branch on its values)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"generate: `max_new_tokens` must be a positive int; got {max_new_tokens!r}")
    config = getattr(pop.module, "generation_config", None)  # the model's defaults, as Hugging Face's generate
    if eos_token_id is None and config is not None:
        eos_token_id = config.eos_token_id
    if pad_token_id is None and config is not None:
        pad_token_id = config.pad_token_id
    eos = None
    if eos_token_id is not None:
        eos = torch.tensor(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id],
                           device=input_ids.device)
        if pad_token_id is None:
            pad_token_id = int(eos[0])
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    accepts = pop._accepts
    # The cache argument and output field: "cache" in transformers >= 5.2x, "past_key_values" before.
    cache_arg = next((a for a in ("cache", "past_key_values") if a in accepts), None)
    if cache_arg is None or "use_cache" not in accepts:
        raise TypeError("generate: the model's forward takes no cache (`cache` or `past_key_values`) and "
                        "`use_cache`; it needs a Hugging Face causal language model")

    def body(model_call, ids, mask):
        kw = {"attention_mask": mask, "use_cache": True}
        pos = None
        if "position_ids" in accepts:
            pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
            kw["position_ids"] = pos
        out = model_call(ids, **kw)
        cache = getattr(out, cache_arg)
        finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        tokens = []
        for step in range(max_new_tokens):
            nxt = out.logits[:, -1].argmax(-1)
            if eos is not None:
                nxt = torch.where(finished, torch.full_like(nxt, pad_token_id), nxt)
                finished = finished | torch.isin(nxt, eos)
            tokens.append(nxt)
            if step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            kw = {"attention_mask": mask, cache_arg: cache, "use_cache": True}
            if pos is not None:
                pos = pos[:, -1:] + 1
                kw["position_ids"] = pos
            out = model_call(nxt[:, None], **kw)
            cache = getattr(out, cache_arg)
        return (torch.cat([ids.expand(len(tokens[0]), -1) if ids.dim() == 1 else ids, torch.stack(tokens, -1)], -1),)

    (result,) = pop.run_batched(body, [input_ids, attention_mask], seeds=seeds, sigma=sigma,
                                antithetic=antithetic, per_individual=[per_individual, False])
    return result
