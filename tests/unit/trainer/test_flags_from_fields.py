"""The flags are made from the config fields: every field has a ``--help`` group and a help, the
help is the field's docstring (one text, no Sphinx markup), and the help of ``lrft train``,
``lrft train-rm`` and ``lrft eval`` lists each flag under its group with the default the
command really takes, written as it is typed."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import attrs
import pytest

from lrft.cli import config_from_args, main
from lrft.cli import train_rm as train_rm_cli
from lrft.cli.eval import EVAL_WORDING, SHARED_FLAGS
from lrft.cli.flags import FLAGS, Flag, flags_of, plain_text
from lrft.config import TrainConfig
from lrft.config.flag_spec import FLAG_SPEC, FlagGroup, FlagSpec, flag
from lrft.rm import RMTrainConfig
from lrft.rm.config import RMFlagGroup

SRC = Path(__file__).resolve().parents[3] / "src" / "lrft"
MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
MARKUP = re.compile(r"``|:(class|mod|func|meth|data|attr|obj):|`~")


def _docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings of ``cls`` and its bases, read here from the source files."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        tree = ast.parse(Path(inspect.getfile(klass)).read_text())
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == klass.__name__]
        for target, doc in zip(node.body, node.body[1:], strict=False):
            if isinstance(target, ast.AnnAssign) and isinstance(doc, ast.Expr):
                assert isinstance(target.target, ast.Name)
                docs[target.target.id] = textwrap.dedent(str(ast.literal_eval(doc.value)))
    return docs


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _sections(text: str) -> dict[str, dict[str, str]]:
    """Section title -> flag name -> that flag's help, on one line."""
    sections: dict[str, dict[str, str]] = {}
    name, current = "", {}
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            name, current = "", sections.setdefault(line[:-1], {})
        elif match := re.match(r"^  --(\w+)(.*)$", line):
            # the flag's spelling, then two spaces or more and its help (or the help below)
            name, spelled = match.group(1), re.split(r"\s{2,}", match.group(2).strip(), maxsplit=1)
            current[name] = spelled[1] if len(spelled) == 2 else ""
        elif name and line.startswith("   "):
            current[name] = f"{current[name]} {line.strip()}".strip()
    return sections


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "4000")  # one line per flag: nothing wraps


@pytest.mark.parametrize("config", [TrainConfig, RMTrainConfig])
def test_every_field_has_a_group_and_a_docstring(config: type) -> None:
    docs = _docstrings(config)
    for field in attrs.fields(config):
        assert isinstance(field.metadata.get(FLAG_SPEC), FlagSpec), f"{field.name}: no group"
        assert docs.get(field.name, "").strip(), f"{config.__name__}.{field.name}: no docstring"


@pytest.mark.parametrize(
    ("config", "flags"), [(TrainConfig, FLAGS), (RMTrainConfig, train_rm_cli.RM_FLAGS)]
)
def test_each_help_is_its_fields_docstring(config: type, flags: tuple[Flag, ...]) -> None:
    docs = _docstrings(config)
    names = [field.name for field in attrs.fields(config)]
    assert [item.name for item in flags] == names
    for item in flags:
        assert item.help == plain_text(docs[item.name], names), item.name
        assert not MARKUP.search(item.help), (item.name, item.help)


def test_a_field_without_a_group_cannot_make_a_flag() -> None:
    @attrs.frozen(kw_only=True)
    class Settings:
        size: int = attrs.field(default=1, metadata=flag(FlagGroup.TRAINING))
        """How many."""
        color: str = "red"
        """Which."""

    with pytest.raises(TypeError, match=r"Settings\.color has no flag group"):
        flags_of(Settings)


def test_the_help_changes_with_the_docstring() -> None:
    @attrs.frozen(kw_only=True)
    class Settings:
        size: int = attrs.field(default=1, metadata=flag(FlagGroup.TRAINING))
        """How many of :class:`~lrft.config.TrainConfig`'s ``color`` (:mod:`lrft.config`)."""
        color: str = attrs.field(default="red", metadata=flag(FlagGroup.TRAINING))
        """The ``red`` or ``blue``
        :func:`lrft.cli.main`."""

    size, color = flags_of(Settings)
    assert size.help == "How many of TrainConfig's --color."
    assert color.help == "The red or blue lrft.cli.main."
    assert (size.kind, color.kind) == (int, str)


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["train-rm"], ["bench"]])
def test_no_help_shows_sphinx_markup(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(command, capsys)
    assert not MARKUP.search(text), MARKUP.search(text)


def test_demo_is_listed_with_the_model_and_data(capsys: pytest.CaptureFixture[str]) -> None:
    sections = _sections(_help(["train"], capsys))
    assert list(sections["model and data"])[:4] == ["pretrain", "preset", "cache_dir", "demo"]
    assert "demo" not in sections["images (vision-language models)"]


def test_a_default_of_two_values_is_shown_as_it_is_typed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _sections(_help(["train"], capsys))["training"]["adam_betas"]
    shown = re.search(r"\[default: ([^\];]*)\]$", line)
    assert shown
    assert shown.group(1) == "0.9 0.999"
    typed = config_from_args([*MODEL, "--adam_betas", *shown.group(1).split()])
    assert typed.adam_betas == (0.9, 0.999) == TrainConfig().adam_betas


def _shown(line: str) -> dict[str, str]:
    match = re.search(r"\[(default: [^\]]*)\]$", line)
    assert match, line
    return dict(part.split(": ", 1) for part in match.group(1).split("; "))


def test_train_rm_help_is_grouped_and_shows_each_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sections = _sections(_help(["train-rm"], capsys))
    assert [t for t in sections if t != "options"] == [g.value for g in RMFlagGroup]
    assert set(sections["options"]) == {"config"}
    model = train_rm_cli.config_from_args(["train-rm", "--pretrain=m", "--dataset=d.jsonl"])
    demo = train_rm_cli.config_from_args(["train-rm"])
    for item in train_rm_cli.RM_FLAGS:
        (holder,) = [title for title, lines in sections.items() if item.name in lines]
        assert holder == item.group.value, item.name
        parts = _shown(sections[holder][item.name])
        if item.computed_default is not None:  # a default computed from other settings
            assert parts["default"] == item.computed_default, item.name
            continue
        plain = demo if item.name in ("pretrain", "dataset") else model  # what the line gives
        assert parts["default"] == _typed(getattr(plain, item.name)), item.name
        assert parts.get("demo", parts["default"]) == _typed(getattr(demo, item.name)), item.name
    assert _shown(sections["training"]["learning_rate"]) == {"default": "1e-05", "demo": "0.0003"}


def _typed(value: object) -> str:
    """A value as one would type it after its flag (hand-written for the types used here)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset" if value is None else str(value)


def test_eval_help_shows_defaults_and_speaks_of_evaluation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sections = _sections(_help(["eval"], capsys))
    shared = sections["shared with lrft train (same meaning)"]
    assert set(shared) == set(SHARED_FLAGS)
    assert set(EVAL_WORDING) <= set(SHARED_FLAGS)
    defaults = TrainConfig()
    for name, line in shared.items():
        assert _shown(line) == {"default": _typed_default(getattr(defaults, name))}, name
        assert not re.search(r"training|the demo|enable_engine_sleep", line), (name, line)
    for name in ("temperature", "top_p"):
        assert "--n_samples responses" in shared[name]
    own = sections["what to evaluate"]
    assert _shown(own["n_samples"]) == {"default": "0"}
    assert _shown(own["greedy"]) == {"default": "on"}


def _typed_default(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "none"
    return _typed(value)
