"""Reward recipes: per data label, which rewards score a sample and with what weights.

``--reward_recipes FILE`` is a JSON or YAML mapping from each label of the data (the
``--label_key`` column; ``""`` for rows without one) to ``{reward name: weight}``. The names
are those the trainer gives its rewards and logs them under: the ``--reward_fn`` reward's own
name (``math``, or the function's name), ``reward_model`` (``reward_model_0``, ``_1``... with
several), ``grm`` (``grm_0``...), ``remote`` (``remote_0``...). For example::

    {"math": {"math": 1.0, "reward_model": 0.2},
     "chat": {"reward_model": 1.0, "grm": 0.5}}

A sample's score is the weighted sum of its label's rewards; every reward still runs once per
batch (on the samples that route to it), so a sharded model's collective forward runs alike on
every rank. Checked before training: each name is a configured reward, each weight finite, every
configured reward appears in some recipe, and every label of the data has a recipe.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from lrft.api.errors import ConfigError
from lrft.rewards import RewardFn, Weighted

Recipes = Mapping[str, Mapping[str, float]]


def read_recipes(path: str) -> dict[str, dict[str, float]]:
    """The recipes in ``path``, shape-checked; raises ``ConfigError`` naming the entry."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"reward_recipes {path!r}: no such file")
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix == ".json":
            values = json.loads(text)
        else:
            import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML is optional and untyped

            values = yaml.safe_load(text)
    except ValueError as error:
        raise ConfigError(f"reward_recipes {path!r} cannot be parsed: {error}") from error
    if not isinstance(values, dict) or not values:
        raise ConfigError(f"reward_recipes {path!r} must map labels to {{reward: weight}}")
    recipes: dict[str, dict[str, float]] = {}
    for label, parts in values.items():
        if not isinstance(parts, dict) or not parts:
            raise ConfigError(
                f"reward_recipes {path!r}: label {label!r} must map reward names to weights, "
                f"got {parts!r}"
            )
        recipe: dict[str, float] = {}
        for name, weight in parts.items():
            number = isinstance(weight, int | float) and not isinstance(weight, bool)
            if not number or not math.isfinite(weight):
                raise ConfigError(
                    f"reward_recipes {path!r}: label {label!r}, reward {name!r}: the weight "
                    f"must be a finite number, got {weight!r}"
                )
            recipe[str(name)] = float(weight)
        recipes["" if label is None else str(label)] = recipe
    return recipes


def recipe_routes(
    recipes: Recipes, rewards: Iterable[RewardFn], labels: Iterable[str], *, path: str
) -> dict[str, tuple[Weighted, ...]]:
    """``CombinedReward`` routes from ``recipes`` over the configured ``rewards`` (by name),
    checked against them and against every label of the data."""
    by_name = {reward.name: reward for reward in rewards}
    used: set[str] = set()
    for label, recipe in recipes.items():
        unknown = sorted(set(recipe) - set(by_name))
        if unknown:
            raise ConfigError(
                f"reward_recipes {path!r}: label {label!r} names rewards {unknown} that are not "
                f"configured; the rewards are {sorted(by_name)}"
            )
        used |= set(recipe)
    unused = sorted(set(by_name) - used)
    if unused:
        raise ConfigError(
            f"reward_recipes {path!r} uses no recipe for the configured rewards {unused}: "
            "each would load and run without ever scoring; drop it or give it a weight"
        )
    missing = sorted(set(labels) - set(recipes))
    if missing:
        raise ConfigError(
            f"reward_recipes {path!r} has no recipe for the data labels {missing}; its labels "
            f"are {sorted(recipes)}"
        )
    return {
        label: tuple(Weighted(reward=by_name[name], weight=w) for name, w in recipe.items())
        for label, recipe in recipes.items()
    }
