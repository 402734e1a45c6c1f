"""Writes src/waitd/_models.py: TypedDicts for what waitd answers, generated
from the API contract (openapi/openapi.json at the repository's root).

Only the answer schemas listed in SCHEMAS are generated: they are plain JSON
objects, enums and unions, which map onto TypedDict, Literal and Union without
loss. The request schemas (CreateWait, CreateGroup, Spec…) are not: they are
large oneOf/allOf trees whose every field is optional, so the client takes a
request as a plain mapping and the server's problem sentence says what is wrong.

    python scripts/gen_models.py            # rewrite src/waitd/_models.py
    python scripts/gen_models.py --check    # exit 1 when it is not current

Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
CONTRACT = PACKAGE.parent.parent / "openapi" / "openapi.json"
OUT = PACKAGE / "src" / "waitd" / "_models.py"

# In dependency order: a schema only names those before it (or itself).
SCHEMAS = [
    "Status",
    "LastPoll",
    "GroupMode",
    "Paused",
    "GroupMember",
    "Wait",
    "WaitPage",
    "EventCreated",
    "EventState",
    "EventRetry",
    "EventSucceeded",
    "EventFailed",
    "EventTimedOut",
    "EventCanceled",
    "EventError",
    "Event",
    "EventPage",
    "ProblemField",
    "Problem",
    "DeliveryStatus",
    "DropReason",
    "Attempt",
    "Delivery",
    "DeliveryPage",
    "ParamKind",
    "Param",
    "PresetSummary",
    "PresetList",
    "Preset",
]

# Schemas named by the generated ones but not generated, and what they become.
OPAQUE = {
    "Labels": "dict[str, str]",
    "Spec": "dict[str, Any]",
    "GroupSpec": "dict[str, Any]",
}


class Gen:
    def __init__(self, schemas: dict[str, Any]) -> None:
        self.schemas = schemas

    def ref(self, ref: str) -> str:
        name = ref.rsplit("/", 1)[-1]
        if name in SCHEMAS:
            return name
        if name in OPAQUE:
            return OPAQUE[name]
        raise SystemExit(f"gen_models: {name} is neither generated nor in OPAQUE")

    def type_of(self, s: dict[str, Any]) -> str:
        if "$ref" in s:
            return self.ref(s["$ref"])
        if "oneOf" in s:
            parts = [self.type_of(x) for x in s["oneOf"]]
            return self.union(parts)
        if "enum" in s:
            return "Literal[" + ", ".join(json.dumps(v) for v in s["enum"]) + "]"
        t = s.get("type")
        if t is None:
            return "Any"
        types = t if isinstance(t, list) else [t]
        parts = [self.one_type(x, s) for x in types if x != "null"]
        if "null" in types:
            parts.append("None")
        return self.union(parts)

    @staticmethod
    def union(parts: list[str]) -> str:
        """The parts joined by |, each once, None last."""
        unique = [p for p in dict.fromkeys(parts) if p != "None"]
        return " | ".join(unique + ["None"] * ("None" in parts))

    def one_type(self, t: str, s: dict[str, Any]) -> str:
        if t == "string":
            return "str"
        if t == "integer":
            return "int"
        if t == "number":
            return "float"
        if t == "boolean":
            return "bool"
        if t == "array":
            return f"list[{self.type_of(s.get('items', {}))}]"
        if t == "object":
            extra = s.get("additionalProperties")
            if isinstance(extra, dict) and not s.get("properties"):
                return f"dict[str, {self.type_of(extra)}]"
            return "dict[str, Any]"
        raise SystemExit(f"gen_models: type {t!r} is not handled")

    def fields(self, s: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The properties and required names of an object schema, allOf merged."""
        if "$ref" in s:
            return self.fields(self.schemas[s["$ref"].rsplit("/", 1)[-1]])
        props: dict[str, Any] = {}
        required: list[str] = []
        for part in s.get("allOf", []):
            p, r = self.fields(part)
            props.update(p)
            required += r
        props.update(s.get("properties", {}))
        required += s.get("required", [])
        return props, required

    def schema(self, name: str) -> str:
        s = self.schemas[name]
        doc = " ".join((s.get("description") or "").split())
        if "properties" in s or "allOf" in s:
            props, required = self.fields(s)
            lines = [f'{name} = TypedDict(\n    "{name}",\n    {{']
            for key in sorted(props):
                t = self.type_of(props[key])
                if key not in required:
                    t = f"NotRequired[{t}]"
                lines.append(f'        "{key}": {t},')
            lines.append("    },\n)")
            out = "\n".join(lines)
        else:
            out = f"{name}: TypeAlias = {self.type_of(s)}"
        if doc:
            out = f"# {doc}\n" + out
        return out


def render() -> str:
    contract = json.loads(CONTRACT.read_text())
    gen = Gen(contract["components"]["schemas"])
    version = contract["info"]["version"]
    body = "\n\n\n".join(gen.schema(n) for n in SCHEMAS)
    return (
        '"""What waitd answers, as TypedDicts.\n\n'
        f"Generated by scripts/gen_models.py from openapi/openapi.json (version {version});\n"
        'do not edit: change the contract and run the script again.\n"""\n\n'
        "from __future__ import annotations\n\n"
        "from typing import Any, Literal, NotRequired, TypeAlias, TypedDict\n\n"
        f"{body}\n"
    )


def main() -> int:
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(
                f"{OUT.relative_to(PACKAGE)} is not current with openapi/openapi.json: "
                "run python scripts/gen_models.py and commit the result",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
