"""Fill the config/README templates in `templates/` with strict key checks.

string.Template does the substitution; we add the checks it lacks: every
placeholder must get a value, and every value must have a placeholder (a typo
in either place is a bug, not a silently empty field).
"""

from __future__ import annotations

from importlib.resources import files
from string import Template


def template_text(name: str) -> str:
    """The raw text of a template shipped in wide_export/tritonserver/templates/."""
    return files("wide_export.tritonserver").joinpath("templates").joinpath(name).read_text()


def placeholders(text: str) -> set[str]:
    """The `${name}` placeholders of a template text."""
    found: set[str] = set()
    for match in Template.pattern.finditer(text):
        if match.group("invalid") is not None:
            raise ValueError(f"malformed placeholder at offset {match.start()}")
        name = match.group("named") or match.group("braced")
        if name:
            found.add(name)
    return found


def render_text(text: str, values: dict[str, object], what: str = "template") -> str:
    """Substitute `values` into `text`; KeyError if the keys and placeholders differ."""
    wanted = placeholders(text)
    missing, unknown = wanted - values.keys(), values.keys() - wanted
    if missing or unknown:
        raise KeyError(f"{what}: missing values {sorted(missing)}, unknown keys {sorted(unknown)}")
    for key, value in values.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise TypeError(f"{what}: value of {key!r} must be str/int/float, got {type(value).__name__}")
    return Template(text).substitute({k: str(v) for k, v in values.items()})


def render(template: str, /, **values: object) -> str:
    """Render the shipped template file `template` with strict key checks."""
    return render_text(template_text(template), values, what=template)
