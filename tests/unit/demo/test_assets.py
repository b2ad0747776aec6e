"""The shipped demo model folder: it loads offline, its tokenizer round-trips, and its accuracy
leaves the headroom the RL demo needs."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import jinja2
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2ForCausalLM,
)

from lrft.api.types import GenerationRequest, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.data import PromptDataConfig, load_prompt_dataset
from lrft.demos.model import (
    ASSETS_DIR,
    MAX_NEW_TOKENS,
    answer_accuracy,
    complete,
    load_model,
    load_tokenizer,
    model_config,
)
from lrft.demos.task import (
    EOS_TEXT,
    INPUT_KEY,
    REFERENCE_KEY,
    AdditionTask,
    Problem,
    write_jsonl,
)
from lrft.demos.tokenizer import (
    EOS_ID,
    EOS_TOKEN,
    PAD_ID,
    PAD_TOKEN,
    VOCAB_SIZE,
    build_tokenizer,
)

TASK = AdditionTask()


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hub reads HF_HUB_OFFLINE once, at import; with the constant set, any request raises.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer()


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return load_model()


def test_the_folder_is_small_and_complete() -> None:
    names = {path.name for path in ASSETS_DIR.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert expected <= names
    size = sum(path.stat().st_size for path in ASSETS_DIR.iterdir())
    assert size < 4_000_000


def test_auto_classes_load_it(tokenizer: PreTrainedTokenizerBase) -> None:
    auto_tokenizer = AutoTokenizer.from_pretrained(ASSETS_DIR)
    assert (auto_tokenizer.eos_token, auto_tokenizer.pad_token) == (EOS_TOKEN, PAD_TOKEN)
    assert (auto_tokenizer.eos_token_id, auto_tokenizer.pad_token_id) == (EOS_ID, PAD_ID)
    assert len(auto_tokenizer) == VOCAB_SIZE
    model = AutoModelForCausalLM.from_pretrained(ASSETS_DIR)
    assert isinstance(model, Qwen2ForCausalLM)
    # The architecture is model_config()'s: only load-time bookkeeping differs.
    bookkeeping = {"_name_or_path", "architectures", "dtype", "transformers_version"}
    loaded = {k: v for k, v in model.config.to_dict().items() if k not in bookkeeping}
    assert loaded == {k: v for k, v in model_config().to_dict().items() if k not in bookkeeping}


def test_the_saved_tokenizer_encodes_as_the_built_one(tokenizer: PreTrainedTokenizerBase) -> None:
    # transformers 5 loads any tokenizer next to a qwen2 config as Qwen2Tokenizer, with Qwen's
    # own pre-tokenizer: the byte-level vocabulary keeps the ids identical.
    built = build_tokenizer()
    texts = [p.prompt + p.answer for p in TASK.eval_problems()[:50]]
    texts += ["hello, world\n\ttabs  and spaces", "héllo ✓ 日本", f"12+35=47{EOS_TOKEN}"]
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids == built.encode(text), text
        assert tokenizer.decode(ids) == text


def test_prompts_are_one_token_per_character(tokenizer: PreTrainedTokenizerBase) -> None:
    assert EOS_TEXT == EOS_TOKEN  # the task module names the token without importing tokenizers
    for problem in TASK.train_problems()[:100]:
        text = problem.prompt + problem.answer
        assert tokenizer.encode(text) == list(text.encode("ascii"))
    assert tokenizer.encode(f"85{EOS_TOKEN}") == [56, 53, EOS_ID]
    assert tokenizer.decode([56, 53, EOS_ID], skip_special_tokens=True) == "85"


def test_chat_template_renders_the_bare_problem(tokenizer: PreTrainedTokenizerBase) -> None:
    user = [{"role": "user", "content": "47+38="}]
    rendered = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert rendered == "47+38="
    system = [{"role": "system", "content": "be careful"}, *user]
    with pytest.raises(jinja2.TemplateError, match="only user messages, got system"):
        tokenizer.apply_chat_template(system, tokenize=False)


@pytest.mark.parametrize("apply_chat_template", [False, True])
def test_prompt_files_load_as_lrft_prompts(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path, apply_chat_template: bool
) -> None:
    problems = TASK.eval_problems()[:20]
    path = write_jsonl(tmp_path / "eval.jsonl", problems)
    config = PromptDataConfig(
        prompt_data=str(path),
        input_key=INPUT_KEY,
        reference_key=REFERENCE_KEY,
        apply_chat_template=apply_chat_template,
    )
    dataset = load_prompt_dataset(config, tokenizer)
    assert [s.prompt_text for s in dataset] == [p.prompt for p in problems]
    assert [list(s.prompt_token_ids) for s in dataset] == [
        list(p.prompt.encode("ascii")) for p in problems
    ]
    assert [s.reference for s in dataset] == [p.answer for p in problems]


def test_recorded_accuracies_match_the_weights(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    recorded = json.loads((ASSETS_DIR / "demo.json").read_text())["metrics"]
    greedy = answer_accuracy(model, tokenizer, TASK.eval_problems())
    assert greedy == pytest.approx(recorded["held_out_greedy_accuracy"], abs=0.01)


def test_greedy_accuracy_is_low_because_carries_are_dropped(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    problems = TASK.eval_problems()[:200]
    with_carry = [p for p in problems if p.has_carry]
    without_carry = [p for p in problems if not p.has_carry]
    # Low overall, but not from a broken model: it adds, and drops carries like its teacher.
    assert 0.10 <= answer_accuracy(model, tokenizer, problems) <= 0.35
    assert answer_accuracy(model, tokenizer, without_carry) >= 0.9
    assert answer_accuracy(model, tokenizer, with_carry) <= 0.15


def test_sampling_finds_answers_that_greedy_misses(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    with_carry = [p for p in TASK.eval_problems()[:60] if p.has_carry]
    sampled = answer_accuracy(model, tokenizer, with_carry, temperature=1.0, samples=8, seed=0)
    assert 0.1 <= sampled <= 0.5


def test_the_hf_engine_serves_it_like_the_demo_decoder(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    # Mixed prompt lengths: the engine left-pads, the demo decoder batches by length.
    problems = [Problem(a=7, b=5), *TASK.eval_problems()[:30], Problem(a=123, b=456)]
    prompts = [tokenizer.encode(p.prompt) for p in problems]
    engine = HFRolloutEngine.from_pretrained(
        ASSETS_DIR, config=HFEngineConfig(device=torch.device("cpu"))
    )
    with engine:
        results = engine.generate(
            [GenerationRequest(prompt_token_ids=p) for p in prompts],
            SamplingParams(
                temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, stop_token_ids=(EOS_ID,)
            ),
        )
    assert [list(r.output_token_ids) for r in results] == complete(model, prompts)
