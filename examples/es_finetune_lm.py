"""ES fine-tuning of a transformer language model from the rewards of its own generations.

Every generation of ES, each individual (the model with its own never-stored
perturbation) greedily continues the same prompts in one population-batched
pass with a KV cache; the reward of an individual is computed from its
continuations; ES moves the evolved parameters toward higher reward.

    # a local Hugging Face checkpoint directory (the real loading path, no download)
    python examples/es_finetune_lm.py --model-path ./my-gpt2 --prompt "The weather today is" \
        --target-text " sunny" --evolve-last 2 --generations 50 --out runs/lm
    # self-contained: a small GPT-2 config with random weights
    python examples/es_finetune_lm.py --tiny --generations 20

The reward here is a simple verifiable one: the fraction of generated tokens
that belong to the target text's tokens. Replace ``reward`` with your own
(a classifier, a unit test, a string match).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from virtual_noise.es import ES


def load(args):
    """(model, prompt ids (B, T), attention mask, target token ids, pad id)."""
    if args.tiny:
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(args.seed)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                           bos_token_id=1, eos_token_id=2))
        g = torch.Generator().manual_seed(args.seed)
        prompts = torch.randint(3, 128, (args.batch, 8), generator=g)
        return model, prompts, torch.ones_like(prompts), torch.tensor([5, 7, 11]), 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(args.model_path):
        sys.exit(f"es_finetune_lm: --model-path {args.model_path!r} is not a directory (a saved Hugging Face model)")
    tokenizer = AutoTokenizer.from_pretrained(args.model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model_path, local_files_only=True)
    tokenizer.padding_side = "left"  # continuations start right after every prompt
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer([args.prompt] * args.batch, return_tensors="pt", padding=True)
    target = torch.tensor(sorted(set(tokenizer.encode(args.target_text, add_special_tokens=False))))
    return model, enc["input_ids"], enc["attention_mask"], target, tokenizer.pad_token_id


def reward(generated: torch.Tensor, prompt_len: int, target: torch.Tensor) -> torch.Tensor:
    """(P, B, T) token ids -> (P,): the fraction of generated tokens that are target tokens."""
    new = generated[..., prompt_len:]
    return torch.isin(new, target.to(new.device)).float().mean(dim=(1, 2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-path", help="a local Hugging Face model directory (from save_pretrained)")
    src.add_argument("--tiny", action="store_true", help="a small random GPT-2, no files needed")
    p.add_argument("--prompt", default="Hello", help="the prompt (with --model-path)")
    p.add_argument("--target-text", default=" yes", help="reward: generating these tokens (with --model-path)")
    p.add_argument("--evolve-last", type=int, default=0, help="evolve only the last N transformer blocks (0: all)")
    p.add_argument("--population", type=int, default=32)
    p.add_argument("--sigma", type=float, default=0.02)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--generations", type=int, default=20)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--batch", type=int, default=4, help="prompts per individual")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="save the fine-tuned model and the reward history here")
    args = p.parse_args(argv)

    model, prompts, mask, target, pad = load(args)
    model = model.to(args.device).eval()
    prompts, mask = prompts.to(args.device), mask.to(args.device)
    evolve = None
    if args.evolve_last:  # the last N blocks of the model's layer stack (its longest nn.ModuleList)
        stack_name, stack = max(((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)),
                                key=lambda nm: len(nm[1]))
        prefixes = tuple(f"{stack_name}.{i}." for i in range(len(stack) - args.evolve_last, len(stack)))

        def evolve(name, param):
            return name.startswith(prefixes)

    es = ES(model, population_size=args.population, sigma=args.sigma, lr=args.lr, seed=args.seed, evolve=evolve)
    print(f"es_finetune_lm | {es.population.n_params:,} evolved parameters | population {args.population} | "
          f"sigma {args.sigma} | device {args.device}")
    history = []
    start = time.perf_counter()
    for generation in range(args.generations):
        es.ask()
        generated = es.generate(prompts, mask, max_new_tokens=args.new_tokens, pad_token_id=pad)
        r = reward(generated, prompts.shape[1], target)
        stats = es.tell(r)
        with torch.no_grad():
            center = reward(es.population.module.generate(prompts, attention_mask=mask, do_sample=False,
                                                          max_new_tokens=args.new_tokens, pad_token_id=pad)[None],
                            prompts.shape[1], target).item()
        history.append({"generation": generation + 1, "mean_reward": stats["mean"], "max_reward": stats["max"],
                        "center_reward": center})
        print(f"generation {generation + 1:3d} | population reward mean {stats['mean']:.3f} max {stats['max']:.3f} | "
              f"center {center:.3f}", flush=True)
    print(f"done in {time.perf_counter() - start:.1f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        model.save_pretrained(args.out)
        with open(os.path.join(args.out, "rewards.json"), "w") as f:
            json.dump(history, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
