"""Forms of the experiment manager, the launch form generated from the engine's JSON Schema.

The launch form is built from ``engine.config.json_schema()`` at runtime instead of being written by
hand, so that a field added to ``RunConfig`` shows up in the browser with its default, help text and
bounds without touching the web app. Validation is the engine's own (``parse_config``): the form only
converts widgets to a nested dict and puts the engine's ``(dotted.path, message)`` errors back on the
widget they belong to.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django import forms

from engine import launch_checks, presets, yamlio
from engine import registry as engine_registry
from engine.config import ALGORITHM_DEFAULTS, ConfigError, RunConfig, json_schema, parse_config
from engine.dotted import deep_merge, get_path, set_path
from webapp.runs import extensions, paths, queries
from webapp.runs.errors import PathNotAllowed

SEP = "__"

# Section order and titles of the generated form (top-level keys of RunConfig).
SECTION_TITLES: dict[str, str] = {
    "general": "General",
    "model": "Model",
    "tokenizer": "Tokenizer",
    "task": "Task",
    "reward": "Reward",
    "rollout": "Rollout generation",
    "algorithm": "Algorithm",
    "kl": "KL penalty",
    "supervised": "Supervised warm start",
    "train": "Training loop",
    "eval": "Evaluation",
}

# Fields whose value is a registered component id: offered as a select of the registry's ids.
REGISTRY_FIELDS: dict[str, str] = {"task.id": "tasks", "reward.id": "rewards", "algorithm.id": "algorithms"}
# List-of-component fields: edited as a small YAML list, ids checked against this registry.
COMPONENT_LIST_FIELDS: dict[str, str] = {"eval.metrics": "metrics", "reward.components": "rewards"}

# The algorithm section holds every algorithm's settings; most apply to a few ids only. Shown all at
# once they made a 6,800 px tab whatever was picked (issue 26.1), so the form groups them and the
# browser shows only those of the chosen id (launch.js reads ``data-algorithms``; hidden inputs are
# still submitted, so the config is the same with or without JavaScript).
_VALUE_BASED = ("ppo", "nlpo", "a2c", "trpo")
_GROUP_BASED = ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
_RL = _VALUE_BASED + _GROUP_BASED
ALGORITHM_FIELD_IDS: dict[str, tuple[str, ...]] = {
    "algorithm.n_epochs": ("ppo", "nlpo", *_GROUP_BASED),
    "algorithm.gamma": _RL,
    "algorithm.gae_lambda": _VALUE_BASED,
    "algorithm.whiten_advantages": _VALUE_BASED,
    "algorithm.advantage_normalization": ("ppo", "nlpo"),
    "algorithm.clip_range": ("ppo", "nlpo", *_GROUP_BASED),
    "algorithm.clip_range_value": ("ppo", "nlpo"),
    "algorithm.vf_coef": ("ppo", "nlpo", "a2c"),
    "algorithm.ent_coef": ("ppo", "nlpo", "a2c"),
    "algorithm.target_kl": ("ppo", "nlpo"),
    "algorithm.clip_grad_per_model": ("ppo", "nlpo"),
    "algorithm.nlpo": ("nlpo",),
    "algorithm.a2c": ("a2c",),
    "algorithm.trpo": ("trpo",),
    "algorithm.group": _GROUP_BASED,
    "algorithm.dpo": ("dpo",),
}
# The algorithm section's top-level fields, grouped by what they tune (in this order, then the
# per-algorithm sub-models, then anything else such as ``extra`` for user algorithms).
ALGORITHM_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "algorithm.optimiser",
        "Optimiser",
        (
            "learning_rate",
            "n_epochs",
            "minibatch_size",
            "grad_accumulation",
            "max_grad_norm",
            "clip_grad_per_model",
            "weight_decay",
        ),
    ),
    (
        "algorithm.advantages",
        "Returns and advantages",
        (
            "gamma",
            "gae_lambda",
            "whiten_advantages",
            "advantage_normalization",
        ),
    ),
    (
        "algorithm.losses",
        "Policy and value losses",
        (
            "clip_range",
            "clip_range_value",
            "vf_coef",
            "ent_coef",
            "target_kl",
        ),
    ),
)


def default_text(path: str, default: Any) -> str:
    """``default 4 (grpo, rloo: 1)``: the schema default and any per-algorithm default of the field,
    so a user who changed a value can see what it was without resetting the form."""

    def show(value: Any) -> str:
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, (list, dict)):
            return "empty" if not value else "set"
        return str(value)

    text = f"default {show(default)}"
    if path.startswith("algorithm.") and path.count(".") == 1:
        key = path.split(".", 1)[1]
        by_value: dict[str, list[str]] = {}
        for algo, overrides in ALGORITHM_DEFAULTS.items():
            if key in overrides and overrides[key] != default:
                by_value.setdefault(show(overrides[key]), []).append(algo)
        extra = "; ".join(f"{', '.join(ids)}: {value}" for value, ids in by_value.items())
        if extra:
            text += f" ({extra})"
    return text


@dataclass
class FieldSpec:
    """One leaf of the config schema, as the form sees it."""

    path: str
    kind: str  # "str" | "int" | "float" | "bool" | "enum" | "multi" | "yaml"
    title: str
    help: str = ""
    nullable: bool = False
    choices: list[str] = field(default_factory=list)
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    container: str = ""  # "dict" | "list" for yaml fields

    @property
    def name(self) -> str:
        return self.path.replace(".", SEP)

    @property
    def section(self) -> str:
        parts = self.path.split(".")
        return parts[0] if len(parts) > 1 else "general"

    @property
    def subsection(self) -> str:
        """A nested model inside a section (``algorithm.nlpo``, ``eval.generation``), else ''."""
        parts = self.path.split(".")
        return ".".join(parts[:-1]) if len(parts) > 2 else ""


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        merged = dict(schema["$defs"][name])
        merged.update({k: v for k, v in node.items() if k != "$ref"})
        return merged
    return node


def schema_fields(schema: dict[str, Any] | None = None) -> list[FieldSpec]:
    """Every leaf of the run config as a FieldSpec, in schema order (nested models recursed)."""
    if schema is None:
        return list(_default_schema_fields())
    return _schema_fields(schema)


@functools.lru_cache(maxsize=1)
def _default_schema_fields() -> tuple[FieldSpec, ...]:
    # The engine's schema is fixed for the life of the process: walk it once.
    return tuple(_schema_fields(json_schema()))


def _schema_fields(schema: dict[str, Any]) -> list[FieldSpec]:
    out: list[FieldSpec] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, raw in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            prop = _resolve(schema, raw)
            nullable = False
            if "anyOf" in prop:
                options = [_resolve(schema, o) for o in prop["anyOf"]]
                non_null = [o for o in options if o.get("type") != "null"]
                nullable = len(non_null) < len(options)
                base = dict(non_null[0]) if len(non_null) == 1 else {"type": "object"}
                base.update({k: v for k, v in prop.items() if k != "anyOf"})
                prop = base
            typ = prop.get("type")
            title = prop.get("title") or key.replace("_", " ").title()
            help_text = prop.get("description", "")
            if typ == "object" and "properties" in prop and prop.get("additionalProperties") is False:
                walk(prop, path)
                continue
            spec = FieldSpec(path=path, kind="str", title=title, help=help_text, nullable=nullable)
            if "enum" in prop:
                spec.kind = "enum"
                spec.choices = [str(c) for c in prop["enum"]]
            elif typ == "boolean":
                spec.kind = "bool"
            elif typ == "integer":
                spec.kind = "int"
            elif typ == "number":
                spec.kind = "float"
            elif typ == "array" and "enum" in (prop.get("items") or {}):
                # A set of choices (train.report_to): checkboxes.
                spec.kind = "multi"
                spec.choices = [str(c) for c in prop["items"]["enum"]]
            elif typ == "object":
                spec.kind, spec.container = "yaml", "dict"
            elif typ == "array":
                spec.kind, spec.container = "yaml", "list"
            spec.minimum = prop.get("minimum")
            spec.maximum = prop.get("maximum")
            spec.exclusive_minimum = prop.get("exclusiveMinimum")
            spec.exclusive_maximum = prop.get("exclusiveMaximum")
            out.append(spec)

    walk(schema, "")
    return out


def default_config() -> dict[str, Any]:
    return RunConfig().to_dict()


# libyaml's emitter when PyYAML has it: the same text as the pure-Python one, ~15x faster (the run
# page's config dump was about half of that page's server time).
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_YAML_DUMPER, sort_keys=False, default_flow_style=False, allow_unicode=True)


def load_yaml_text(text: str, what: str = "YAML") -> Any:
    """Parse YAML typed into a textarea; a syntax error names the line."""
    try:
        return yamlio.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise forms.ValidationError(f"bad {what}{where}: {getattr(exc, 'problem', None) or exc}") from None


# ---------------------------------------------------------------- component choices


def registry_ids(name: str) -> list[str]:
    """Ids of one engine registry (``tasks``, ``rewards``, ``metrics``, ``algorithms``)."""
    return list(getattr(engine_registry, name).ids())


def list_presets() -> list[dict[str, str]]:
    """The engine's presets as ``[{"name", "description", "task", "variant"}]`` for the preset menu."""
    return [
        {
            "name": str(item["name"]),
            "description": str(item.get("description", "")),
            "task": str(item.get("task", "")),
            "variant": str(item.get("variant", "")),
        }
        for item in presets.list_presets()
    ]


def load_preset(name: str) -> dict[str, Any]:
    """A preset's config dict, normalised by the schema; ConfigError (naming the presets) when unknown."""
    return parse_config(dict(presets.load_preset(name)), source=f"preset {name}").to_dict()


# ---------------------------------------------------------------- the generated form


def _yaml_text(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    return dump_yaml(value)


class RunConfigForm(forms.Form):
    """The whole RunConfig as a flat form; ``self.config`` holds the validated RunConfig."""

    def __init__(
        self,
        data: Any = None,
        initial_config: dict[str, Any] | None = None,
        reward_choice: str = "",
        **kwargs: Any,
    ):
        super().__init__(data, **kwargs)
        self.specs = schema_fields()
        self.config: RunConfig | None = None
        # Rewards other apps offer (e.g. reward models trained from human judgments), by choice id.
        self.reward_choices = {c["id"]: c for c in extensions.reward_choices()}
        self.defaults = default_config()
        base = default_config()
        if initial_config:
            base = _deep_merge(base, initial_config)
        self.initial_config = base
        for spec in self.specs:
            self.fields[spec.name] = self._make_field(spec, get_path(base, spec.path))
        if self.reward_choices:
            self.fields["reward_preset"] = forms.ChoiceField(
                required=False,
                label="Reward choice",
                help_text="A reward offered by another part of the app (e.g. a reward model trained from "
                "human judgments); it replaces the reward fields below.",
                initial=reward_choice if reward_choice in self.reward_choices else "",
                choices=[("", "(none: use the reward below)")]
                + [(cid, c["label"]) for cid, c in self.reward_choices.items()],
                widget=forms.Select(attrs={"data-replaces-section": "reward"}),
            )

    # Widgets ---------------------------------------------------------------------------------
    def _make_field(self, spec: FieldSpec, initial: Any) -> forms.Field:
        made = self._make_widget_field(spec, initial)
        # Read by _field.html: which algorithm ids the field applies to, and its default.
        owner = spec.subsection if spec.subsection in ALGORITHM_FIELD_IDS else spec.path
        made.algorithms = " ".join(ALGORITHM_FIELD_IDS.get(owner, ()))  # type: ignore[attr-defined]
        made.default_text = default_text(spec.path, get_path(self.defaults, spec.path))  # type: ignore[attr-defined]
        return made

    def _make_widget_field(self, spec: FieldSpec, initial: Any) -> forms.Field:
        common: dict[str, Any] = {"label": spec.title, "help_text": spec.help, "initial": initial}
        registry = REGISTRY_FIELDS.get(spec.path)
        if registry:
            ids = registry_ids(registry)
            if ids:
                choices = [(i, i) for i in ids]
                return forms.ChoiceField(choices=choices, required=True, **common)
        if spec.kind == "enum":
            choices = [(c, c) for c in spec.choices]
            if spec.nullable:
                choices = [("", "(none)")] + choices
            return forms.ChoiceField(choices=choices, required=not spec.nullable, **common)
        if spec.kind == "bool":
            return forms.BooleanField(required=False, **common)
        if spec.kind == "multi":
            return forms.MultipleChoiceField(
                choices=[(c, c) for c in spec.choices],
                required=False,
                widget=forms.CheckboxSelectMultiple,
                **common,
            )
        attrs: dict[str, Any] = {}
        low = spec.minimum if spec.minimum is not None else spec.exclusive_minimum
        high = spec.maximum if spec.maximum is not None else spec.exclusive_maximum
        if low is not None:
            attrs["min"] = low
        if high is not None:
            attrs["max"] = high
        if spec.kind == "int":
            attrs["step"] = 1
            return forms.IntegerField(
                required=not spec.nullable, widget=forms.NumberInput(attrs=attrs), **common
            )
        if spec.kind == "float":
            # Free-text number so that 1e-05 keeps its notation; bounds are the engine's to check.
            attrs.update({"inputmode": "decimal", "class": "num"})
            return forms.FloatField(required=not spec.nullable, widget=forms.TextInput(attrs=attrs), **common)
        if spec.kind == "yaml":
            common["initial"] = _yaml_text(initial)
            hint = " (YAML list of {id, args})" if spec.path in COMPONENT_LIST_FIELDS else " (YAML mapping)"
            attrs = {"rows": 3, "class": "yaml", "spellcheck": "false"}
            if spec.path in COMPONENT_LIST_FIELDS:
                ids = registry_ids(COMPONENT_LIST_FIELDS[spec.path])
                if ids:
                    hint += ". Registered ids: " + ", ".join(ids)
                    # launch.js turns this into an "add component" select (ids only, never code).
                    attrs["data-registry-ids"] = ",".join(ids)
                    attrs["data-weighted"] = "1" if spec.path == "reward.components" else ""
            common["help_text"] = (spec.help + hint).strip()
            return forms.CharField(required=False, widget=forms.Textarea(attrs=attrs), **common)
        return forms.CharField(required=False, strip=True, **common)

    # Grouping for templates --------------------------------------------------------------------
    def sections(self) -> list[dict[str, Any]]:
        """Fields grouped into ``[{key, title, groups: [{key, title, fields}], has_errors}]``."""
        by_section: dict[str, dict[str, list[forms.BoundField]]] = {}
        for spec in self.specs:
            by_section.setdefault(spec.section, {}).setdefault(spec.subsection, []).append(self[spec.name])
        if "reward_preset" in self.fields:
            by_section.setdefault("reward", {}).setdefault("", []).insert(0, self["reward_preset"])
        order = list(SECTION_TITLES) + [k for k in by_section if k not in SECTION_TITLES]
        out = []
        for key in order:
            if key not in by_section:
                continue
            groups = []
            if key == "algorithm":
                groups.extend(self._algorithm_groups(by_section[key]))
            for sub, bound in by_section[key].items():
                title = sub.split(".")[-1].replace("_", " ").title() if sub else ""
                if sub == "algorithm.group":
                    title = "Group algorithms (GRPO, RLOO, REINFORCE++)"
                elif sub in ALGORITHM_FIELD_IDS:
                    title = sub.split(".")[-1].upper() + " settings"
                if bound:
                    algos = " ".join(ALGORITHM_FIELD_IDS.get(sub, ()))
                    virtual = sub == "algorithm.other"
                    groups.append(
                        {"key": sub, "title": title, "fields": bound, "algorithms": algos, "virtual": virtual}
                    )
            has_errors = any(b.errors for g in groups for b in g["fields"])
            out.append(
                {
                    "key": key,
                    "title": SECTION_TITLES.get(key, key.title()),
                    "groups": groups,
                    "has_errors": has_errors,
                }
            )
        return out

    def _algorithm_groups(self, by_sub: dict[str, list[forms.BoundField]]) -> list[dict[str, Any]]:
        """Pull the algorithm section's top-level fields into titled groups (``ALGORITHM_GROUPS``),
        leaving ``algorithm.id`` first on its own and unlisted fields (``extra``) where they were."""
        top = by_sub.get("", [])
        by_key = {b.name.split(SEP, 1)[1]: b for b in top if SEP in b.name}
        taken: set[str] = set()
        groups = (
            [{"key": "", "title": "", "fields": [by_key["id"]], "algorithms": ""}] if "id" in by_key else []
        )
        taken.add("id")
        for key, title, names in ALGORITHM_GROUPS:
            fields = [by_key[n] for n in names if n in by_key]
            taken.update(n for n in names if n in by_key)
            if fields:
                groups.append(
                    {"key": key, "title": title, "fields": fields, "algorithms": "", "virtual": True}
                )
        by_sub[""] = [b for b in top if b.name.split(SEP, 1)[-1] not in taken]
        if by_sub[""]:  # what is left (``extra``) goes after the per-algorithm groups
            rest = by_sub.pop("")
            by_sub["algorithm.other"] = rest
        return groups

    # Conversion and validation -------------------------------------------------------------------
    def _field_value(self, spec: FieldSpec, value: Any) -> Any:
        if spec.kind == "yaml":
            parsed = load_yaml_text(value or "", what=spec.title)
            if parsed is None:
                return [] if spec.container == "list" else {}
            if spec.container == "list" and not isinstance(parsed, list):
                raise forms.ValidationError("expected a YAML list, e.g. '- id: bleu'")
            if spec.container == "dict" and not isinstance(parsed, dict):
                raise forms.ValidationError("expected a YAML mapping, e.g. 'key: value'")
            registry = COMPONENT_LIST_FIELDS.get(spec.path)
            if registry and isinstance(parsed, list):
                known = registry_ids(registry)
                for i, item in enumerate(parsed):
                    cid = item.get("id") if isinstance(item, dict) else None
                    if known and cid not in known:
                        raise forms.ValidationError(
                            f"item {i}: unknown id {cid!r}; registered ids: {', '.join(known)}"
                        )
            return parsed
        if value in ("", None) and spec.kind in ("str", "enum", "int", "float"):
            return None if spec.nullable else ("" if spec.kind == "str" else None)
        return value

    def _convert(self, spec: FieldSpec) -> Any:
        """One widget's raw POST value → config value (raises ValidationError)."""
        bound = self[spec.name]
        raw = bound.field.widget.value_from_datadict(self.data, self.files, self.add_prefix(spec.name))
        return self._field_value(spec, bound.field.clean(raw))

    def config_dict(self) -> dict[str, Any]:
        """The nested config the (validated) widgets describe."""
        out: dict[str, Any] = {}
        cleaned = getattr(self, "cleaned_data", {}) or {}
        for spec in self.specs:
            if spec.name in cleaned:
                set_path(out, spec.path, cleaned[spec.name])
        choice = cleaned.get("reward_preset")
        if choice:
            out["reward"] = dict(self.reward_choices[choice]["config"])
        return out

    def loose_config_dict(self) -> dict[str, Any]:
        """The config as typed, for the YAML view of a half-edited form: a widget that does not
        convert keeps its raw text, so the YAML view shows it and validation there names it."""
        if not self.is_bound:
            return self.initial_config
        out: dict[str, Any] = {}
        for spec in self.specs:
            try:
                value = self._convert(spec)
            except forms.ValidationError:
                value = self.data.get(self.add_prefix(spec.name))
            set_path(out, spec.path, value)
        choice = self.data.get(self.add_prefix("reward_preset"))
        if choice and choice in self.reward_choices:
            out["reward"] = dict(self.reward_choices[choice]["config"])
        return out

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        for spec in self.specs:
            if spec.name in cleaned and spec.name not in self.errors:
                try:
                    cleaned[spec.name] = self._field_value(spec, cleaned[spec.name])
                except forms.ValidationError as exc:
                    self.add_error(spec.name, exc)
        out_dir = cleaned.get(SEP.join(["train", "output_dir"]))
        if out_dir and "train__output_dir" not in self.errors:
            try:
                cleaned["train__output_dir"] = str(paths.check_output_dir(out_dir))
            except PathNotAllowed as exc:
                self.add_error("train__output_dir", str(exc))
        # The engine validates even when some widgets failed, so that every error shows at once;
        # a widget that failed keeps its default here and its own error is not repeated.
        # So do this installation's checks (components, their arguments, task x algorithm x settings,
        # engine.launch_checks), on the schema-valid config or, when it is not, on the raw one.
        merged = _deep_merge(default_config(), self.config_dict())
        config: RunConfig | None = None
        try:
            config = parse_config(merged, source="launch form")
        except ConfigError as exc:
            self.add_config_errors(exc)
        checked = config.to_dict() if config is not None else merged
        launch = launch_checks.config_errors(checked)
        if config is not None:
            launch += launch_checks.size_errors(checked, local_files=False)
        if launch:
            self.add_config_errors(ConfigError("launch checks", launch), several=True)
        if not self.errors:
            self.config = config
        return cleaned

    def add_config_errors(self, exc: ConfigError, *, several: bool = False) -> None:
        """Put each ``(dotted.path, message)`` of the engine on the widget of the longest matching path.

        A widget that already has an error (its own conversion failed, so the engine saw its default)
        gets no schema error about that default; ``several``: the launch checks' errors, each a
        separate fact about the config, are all added (``task.args`` can lack one argument and have
        an unknown other)."""
        names = {spec.path: spec.name for spec in self.specs}
        for path, message in exc.errors or [("(root)", str(exc))]:
            target = field_for_path(path, names, message)
            if target:
                shown = [str(m) for m in self.errors.get(target, [])]
                if not shown or (several and message not in shown):
                    self.add_error(target, message)
            else:
                self.add_error(None, f"{path}: {message}")


def field_for_path(path: str, names: dict[str, str], message: str = "") -> str | None:
    """``eval.metrics[0].id`` → the widget of ``eval.metrics``. A model-level error (path
    ``rollout``, e.g. "min_new_tokens must not exceed max_new_tokens") goes on the first leaf of that
    model whose name the message mentions."""
    clean = path.split("[", 1)[0]
    if clean in names:
        return names[clean]
    mentioned = [
        (message.find(leaf.rsplit(".", 1)[-1]), name)
        for leaf, name in names.items()
        if leaf.startswith(clean + ".")
        and "." not in leaf[len(clean) + 1 :]
        and leaf.rsplit(".", 1)[-1] in message
    ]
    if mentioned:
        return min(mentioned)[1]  # the field the message names first
    parts = clean.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in names:
            return names[candidate]
        parts.pop()
    return None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A config overlaid on another; a component's ``args`` and ``extra`` are replaced whole, because
    a preset's args for one component id mean nothing to another."""
    return deep_merge(base, over, replace=lambda key, old, new: key in ("args", "extra"))


def form_data_from_config(config: dict[str, Any]) -> dict[str, str]:
    """POST-style data for a RunConfigForm describing ``config`` (YAML view → form round trip).
    Keys the schema does not know are not representable as widgets and are returned by
    ``unknown_keys``."""
    data: dict[str, str] = {}
    defaults = default_config()
    for spec in schema_fields():
        value = get_path(config, spec.path, _MISSING)
        if value is _MISSING:
            value = get_path(defaults, spec.path)
        if spec.kind == "bool":
            if value:
                data[spec.name] = "on"
        elif spec.kind == "multi":
            data[spec.name] = [str(v) for v in value] if isinstance(value, list) else value
        elif spec.kind == "yaml":
            data[spec.name] = _yaml_text(value)
        elif value is None:
            data[spec.name] = ""
        else:
            data[spec.name] = str(value)
    return data


_MISSING = object()


def unknown_keys(config: dict[str, Any]) -> list[str]:
    known = {spec.path for spec in schema_fields()}
    prefixes = {".".join(p.split(".")[:i]) for p in known for i in range(1, p.count(".") + 1)}
    out = []
    for path in queries.flatten(config):
        if path in known or any(path.startswith(k + ".") for k in known):
            continue
        if path in prefixes:
            continue
        out.append(path)
    return out


# ---------------------------------------------------------------- other forms


class YamlConfigForm(forms.Form):
    """The same config as one YAML document; engine errors are listed with their dotted paths."""

    config_yaml = forms.CharField(
        label="Config (YAML)",
        widget=forms.Textarea(attrs={"rows": 30, "class": "yaml", "spellcheck": "false"}),
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.config: RunConfig | None = None
        self.raw: dict[str, Any] | None = None
        self.config_errors: list[tuple[str, str]] = []

    def clean_config_yaml(self) -> str:
        text = self.cleaned_data["config_yaml"]
        data = load_yaml_text(text, what="YAML")
        if not isinstance(data, dict):
            raise forms.ValidationError(
                "the config must be a YAML mapping (sections like 'model:', 'train:')"
            )
        self.raw = data
        errors: list[tuple[str, str]] = []
        try:
            self.config = parse_config(data, source="YAML")
        except ConfigError as exc:
            errors = list(exc.errors) or [("(root)", str(exc))]
        # This installation's checks too, on the raw mapping when the schema refused it: an unknown
        # algorithm id is listed beside a type error, not after it is fixed.
        checked = self.config.to_dict() if self.config is not None else data
        named = {f for f, _m in errors}
        launch = launch_checks.config_errors(checked)
        if self.config is not None:  # sizes need a valid schema (they compute with its numbers)
            launch += launch_checks.size_errors(checked, local_files=False)
        errors += [e for e in launch if e[0] not in named]
        if errors:
            self.config = None
            self.config_errors = errors
            raise forms.ValidationError([f"{path}: {msg}" for path, msg in errors])
        return text


class RunMetaForm(forms.Form):
    """What a run has beyond its config: tags and notes."""

    tags = forms.CharField(required=False, help_text="Comma-separated, e.g. 'imdb, baseline'.")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def clean_tags(self) -> list[str]:
        raw = self.cleaned_data.get("tags") or ""
        tags = [t.strip() for t in raw.split(",") if t.strip()]
        for t in tags:
            if len(t) > 64:
                raise forms.ValidationError(f"tag {t[:20]!r}... is longer than 64 characters")
        return list(dict.fromkeys(tags))


class ImportRunForm(forms.Form):
    """Import a run directory written by the engine's CLI (config.json + metrics.jsonl ...)."""

    path = forms.CharField(label="Run directory", max_length=1000)
    tags = forms.CharField(required=False)

    def clean_path(self) -> Path:
        raw = self.cleaned_data["path"].strip()
        if not Path(raw).expanduser().is_absolute():
            raise forms.ValidationError("give an absolute path")
        try:
            resolved = paths.check_path(raw)
        except PathNotAllowed as exc:
            raise forms.ValidationError(str(exc)) from None
        if not resolved.is_dir():
            raise forms.ValidationError(f"{resolved} is not a directory")
        if not (resolved / "config.json").exists() and not (resolved / "metrics.jsonl").exists():
            raise forms.ValidationError(
                f"{resolved} has no config.json or metrics.jsonl: not a run directory"
            )
        return resolved

    def clean_tags(self) -> list[str]:
        raw = self.cleaned_data.get("tags") or ""
        return [t.strip() for t in raw.split(",") if t.strip()]
