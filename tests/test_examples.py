"""The examples run as their docstrings say."""

import json
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def run(*args, cwd=None):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_ops_demo():
    out = run(os.path.join(EXAMPLES, "ops_demo.py"))
    assert "population output (128, 32, 4)" in out


def test_es_finetune_lm_tiny(tmp_path):
    """ES fine-tuning of a small GPT-2 from the rewards of its population-batched generations."""
    pytest.importorskip("transformers")
    out = run(os.path.join(EXAMPLES, "es_finetune_lm.py"), "--tiny", "--generations", "12", "--population", "16",
              "--sigma", "0.1", "--lr", "0.02", "--evolve-last", "1", "--out", str(tmp_path / "lm"))
    assert "evolved parameters" in out and "generation  12" in out
    history = json.loads((tmp_path / "lm" / "rewards.json").read_text())
    assert len(history) == 12
    # The reward the population reaches rises above the untrained center's.
    assert max(h["max_reward"] for h in history) > history[0]["center_reward"]
    assert history[-1]["center_reward"] >= history[0]["center_reward"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "lm", local_files_only=True)  # the saved model loads


def test_es_finetune_lm_model_path(tmp_path):
    """The real loading path: a local Hugging Face checkpoint directory with its tokenizer."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["hello", "world", "yes", "no", "the", "sun", "rain", "<pad>", "<eos>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(words),
                                                                 n_positions=32, eos_token_id=8, bos_token_id=8))
    path = tmp_path / "ckpt"
    model.save_pretrained(path)
    fast.save_pretrained(path)
    out = run(os.path.join(EXAMPLES, "es_finetune_lm.py"), "--model-path", str(path), "--prompt", "hello world",
              "--target-text", "yes", "--generations", "3", "--population", "8")
    assert "generation   3" in out
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "es_finetune_lm.py"), "--model-path",
                           str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode != 0 and "is not a directory" in proc.stderr and "Traceback" not in proc.stderr
