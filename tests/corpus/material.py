"""The noise around what users state: source files, data files, logs and command output.

Everything here is generated from one half's domain vocabulary (`dev.json`, `heldout.json`,
`fresh.json`: `languages.<lang>.domain`) with a seeded `random.Random`, so a session is the
same bytes on every run. Nothing here is prose the user typed: it is what a client sends *around* it (files
added to the chat, tool output, pasted logs), and a ledger must never copy a line of it. Some
of it reads like a rule on purpose (code comments such as "Do not change the order of these
columns", a CONTRIBUTING page full of "must" and "never"), because real repositories do.

The dev half's code is Python, the held-out half's Go, the fresh half's Rust, so a rule tuned
on the shape of one half's code lines is not silently tested on the same shape.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from . import rust
from .names import camel, snake

Domain = Mapping[str, Any]


def module_path(domain: Domain, module: str) -> str:
    if domain["code"] == "go":
        return f"internal/{module}/{module.split('/')[-1]}.go"
    if domain["code"] == "rust":
        return f"src/{module}.rs"
    return f"{domain['package']}/{module}.py"


def functions(domain: Domain) -> list[str]:
    """Every function name the domain's code defines (for tasks and questions)."""
    names = []
    for verb in domain["verbs"]:
        for entity in domain["entities"]:
            names.append(verb + camel(entity) if domain["code"] == "go" else f"{verb}_{entity}")
    return names


# --- source files --------------------------------------------------------------------------


def _python_function(rng: random.Random, domain: Domain, name: str, entity: str) -> list[str]:
    fields = rng.sample(domain["fields"], 4)
    cls = camel(entity)
    lines = [
        f"def {name}(session: Session, {entity}_id: int, *, dry_run: bool = False) -> {cls} | None:",
        f'    """{name.replace("_", " ").capitalize()} for one {entity.replace("_", " ")}."""',
        "    row = session.execute(",
        f'        "SELECT {", ".join(fields)} FROM {entity}s WHERE id = :id",',
        f'        {{"id": {entity}_id}},',
        "    ).one_or_none()",
        "    if row is None:",
        f'        log.warning("{entity}_missing", {entity}_id={entity}_id)',
        "        return None",
        f"    item = {cls}(**row._mapping)",
    ]
    for _ in range(rng.randint(2, 6)):
        field = rng.choice(fields)
        limit = rng.choice((0, 1, 100, 250, 1000, 86400))
        lines += [
            f"    if item.{field} is not None and len(str(item.{field})) > {limit}:",
            f"        item = replace(item, {field}=str(item.{field})[:{limit}])",
        ]
    if rng.random() < 0.4:
        lines.append(f"    {rng.choice(domain['comment_rules'])}")
    lines += [
        "    if dry_run:",
        "        return item",
        f'    session.execute(UPDATE_{entity.upper()}, {{"id": {entity}_id, "status": "{rng.choice(("ready", "done", "queued", "failed"))}"}})',
        f'    log.info("{name}", {entity}_id={entity}_id, elapsed_ms=round(clock() * 1000, 1))',
        "    return item",
        "",
        "",
    ]
    return lines


def _go_function(rng: random.Random, domain: Domain, name: str, entity: str) -> list[str]:
    fields = rng.sample(domain["fields"], 4)
    cls = camel(entity)
    lines = [
        f"// {name} handles one {entity.replace('_', ' ')}.",
        f"func (s *Service) {name}(ctx context.Context, id int64) (*{cls}, error) {{",
        f"\tvar v {cls}",
        f'\trow := s.db.QueryRowContext(ctx, "SELECT {", ".join(snake(f) for f in fields)} FROM {entity}s WHERE id = $1", id)',
        f"\tif err := row.Scan({', '.join('&v.' + f for f in fields)}); err != nil {{",
        f'\t\treturn nil, fmt.Errorf("{name} %d: %w", id, err)',
        "\t}",
    ]
    for _ in range(rng.randint(2, 6)):
        field = rng.choice(fields)
        limit = rng.choice((0, 1, 100, 250, 1000, 86400))
        lines += [
            f"\tif len(fmt.Sprint(v.{field})) > {limit} {{",
            f'\t\ts.log.Warn("{snake(name)}_clipped", "field", "{field}", "id", id)',
            "\t}",
        ]
    if rng.random() < 0.4:
        lines.append(f"\t{rng.choice(domain['comment_rules'])}")
    lines += [
        f'\tif _, err := s.db.ExecContext(ctx, update{cls}, id, "{rng.choice(("ready", "done", "queued", "failed"))}"); err != nil {{',
        "\t\treturn nil, err",
        "\t}",
        f"\ts.metrics.{cls}Total.Inc()",
        "\treturn &v, nil",
        "}",
        "",
    ]
    return lines


def source_file(rng: random.Random, domain: Domain, module: str, functions_count: int) -> str:
    """A source module of the domain's language with `functions_count` functions."""
    if domain["code"] == "rust":
        return rust.source_file(rng, domain, module, functions_count)
    entities = rng.sample(domain["entities"], 3)
    verbs = rng.sample(domain["verbs"], min(len(domain["verbs"]), functions_count))
    if domain["code"] == "go":
        lines = [
            f"// Package {module.split('/')[-1]} is part of {domain['project']}.",
            f"package {module.split('/')[-1]}",
            "",
            "import (",
            '\t"context"',
            '\t"database/sql"',
            '\t"fmt"',
            '\t"log/slog"',
            "",
            f'\t"github.com/example/{domain["project"]}/internal/metrics"',
            ")",
            "",
            "type Service struct {",
            "\tdb      *sql.DB",
            "\tlog     *slog.Logger",
            "\tmetrics *metrics.Registry",
            "}",
            "",
        ]
        for entity in entities:
            lines.append(f"type {camel(entity)} struct {{")
            for field in domain["fields"][:6]:
                lines.append(f'\t{field} string `json:"{snake(field)}"`')
            lines += ["}", ""]
            lines.append(
                f'const update{camel(entity)} = "UPDATE {entity}s SET status = $2 WHERE id = $1"'
            )
            lines.append("")
        for i in range(functions_count):
            entity = entities[i % len(entities)]
            verb = verbs[i % len(verbs)]
            suffix = "" if i < len(verbs) else str(i // len(verbs) + 1)
            lines += _go_function(rng, domain, verb + camel(entity) + suffix, entity)
        return "\n".join(lines)
    lines = [
        f'"""{module.split("/")[-1].replace("_", " ").capitalize()} for {domain["project"]}."""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass, replace",
        "from time import perf_counter as clock",
        "",
        "import structlog",
        "from sqlalchemy.orm import Session",
        "",
        "log = structlog.get_logger(__name__)",
        "",
    ]
    for entity in entities:
        lines += ["", "@dataclass(frozen=True)", f"class {camel(entity)}:"]
        for field in domain["fields"][:6]:
            lines.append(f"    {field}: str | None = None")
        lines += [
            "",
            f'UPDATE_{entity.upper()} = "UPDATE {entity}s SET status = :status WHERE id = :id"',
            "",
        ]
    lines.append("")
    for i in range(functions_count):
        entity = entities[i % len(entities)]
        verb = verbs[i % len(verbs)]
        suffix = "" if i < len(verbs) else str(i // len(verbs) + 1)
        lines += _python_function(rng, domain, f"{verb}_{entity}{suffix}", entity)
    return "\n".join(lines).rstrip() + "\n"


def data_file(rng: random.Random, domain: Domain, rows: int) -> str:
    """A CSV of numbers: the kind of file whose lines a ledger once copied by the hundred."""
    data = domain["data"]
    lines = [data["header"]]
    keys = data["keys"]
    base = data["base"]
    for row in range(rows):
        day = f"2024-{1 + row // 28 % 12:02d}-{1 + row % 28:02d}"
        if not keys:  # a sensor series: time and three measurements
            values = [f"{b * (1 + rng.uniform(-0.05, 0.05)):.3f}" for b in base]
            lines.append(f"{day}T{row % 24:02d}:{rng.randint(0, 59):02d}:00Z," + ",".join(values))
        elif isinstance(base[0], float):
            i = row % len(keys)
            lines.append(f"{day},{keys[i]},{base[i] * (1 + rng.uniform(-0.03, 0.03)):.6f}")
        else:
            i = row % len(keys)
            value = int(base[i] * (1 + rng.uniform(-0.2, 0.4)))
            lines.append(
                f"{keys[i]},{day if row % 2 else rng.randint(1, 30)},{value},{rng.randint(0, value)}"
            )
    return "\n".join(lines) + "\n"


def repo_map(rng: random.Random, domain: Domain) -> str:
    """An Aider-style repo map: paths, each with a few elided signatures."""
    out = []
    for module in domain["modules"]:
        out.append(module_path(domain, module) + ":")
        out.append("⋮")
        for entity in rng.sample(domain["entities"], 2):
            out.append(
                {
                    "python": f"│class {camel(entity)}:",
                    "rust": f"│pub struct {camel(entity)} {{",
                }.get(domain["code"], f"│type {camel(entity)} struct {{")
            )
            out.append("⋮")
        for verb in rng.sample(domain["verbs"], 3):
            entity = rng.choice(domain["entities"])
            if domain["code"] == "python":
                out.append(f"│def {verb}_{entity}(session, {entity}_id, *, dry_run=False):")
            elif domain["code"] == "rust":
                out.append(
                    f"│    pub async fn {verb}_{entity}(&self, id: i64) -> Result<{camel(entity)}, Error> {{"
                )
            else:
                out.append(
                    f"│func (s *Service) {verb}{camel(entity)}(ctx context.Context, id int64) (*{camel(entity)}, error) {{"
                )
            out.append("⋮")
        out.append("")
    return "\n".join(out)


# --- command output ------------------------------------------------------------------------


def test_log(rng: random.Random, domain: Domain, cases: int, failures: int) -> tuple[str, str]:
    """(command, output) of a test run with `failures` failing cases."""
    names = functions(domain)
    failing = set(rng.sample(range(cases), failures))
    if domain["code"] == "rust":
        return rust.cargo_test(rng, domain, names, cases, failing)
    if domain["code"] == "go":
        lines = []
        for i in range(cases):
            name = "Test" + names[(i * 7) % len(names)]
            took = f"{rng.uniform(0, 0.4):.2f}s"
            lines.append(f"=== RUN   {name}")
            if i in failing:
                lines += [
                    f'    {snake(name)}_test.go:{rng.randint(20, 300)}: got status "failed", want "ready"',
                    f"--- FAIL: {name} ({took})",
                ]
            else:
                lines.append(f"--- PASS: {name} ({took})")
        verdict = "FAIL" if failures else "ok"
        lines.append(
            f"{verdict}\tgithub.com/example/{domain['project']}/internal/...\t{rng.uniform(2, 20):.3f}s"
        )
        return "go test ./...", "\n".join(lines)
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        f"rootdir: /home/dev/{domain['project']}",
        f"collected {cases} items",
        "",
    ]
    module = "tests/unit/test_" + rng.choice(domain["modules"]).split("/")[-1] + ".py"
    marks = "".join("F" if i in failing else "." for i in range(cases))
    for start in range(0, cases, 60):
        lines.append(f"{module} {marks[start : start + 60]}")
    lines += [
        "",
        "=================================== FAILURES ===================================",
    ]
    for i in sorted(failing):
        name = names[(i * 7) % len(names)]
        lines += [
            f"_________________________ test_{name} _________________________",
            "",
            f"    def test_{name}(session):",
            f"        result = {name}(session, {rng.randint(1, 9999)})",
            '>       assert result.status == "ready"',
            "E       AssertionError: assert 'failed' == 'ready'",
            "",
            f"{module}:{rng.randint(20, 400)}: AssertionError",
        ]
    lines.append(
        f"=========================== {failures} failed, {cases - failures} passed in {rng.uniform(2, 40):.2f}s ==========================="
    )
    return f"pytest {module} -q", "\n".join(lines)


def service_log(rng: random.Random, domain: Domain, lines_count: int) -> tuple[str, str]:
    """(command, output) of a service's log: mostly routine lines, a few errors."""
    levels = ["INFO"] * 12 + ["DEBUG"] * 6 + ["WARN"] * 2 + ["ERROR"]
    out = []
    hour, minute = rng.randint(0, 20), 0
    for i in range(lines_count):
        minute = (minute + rng.randint(0, 3)) % 60
        level = rng.choice(levels)
        entity = rng.choice(domain["entities"])
        verb = rng.choice(domain["verbs"])
        ip = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        if level == "ERROR":
            msg = f'{snake(verb)}_{entity} failed id={rng.randint(1000, 99999)} err="timeout after {rng.choice((5, 10, 30))}s" peer={ip}'
        else:
            msg = f"{snake(verb)}_{entity} id={rng.randint(1000, 99999)} took_ms={rng.randint(1, 900)} peer={ip}"
        out.append(
            f"2024-10-{1 + i // 400 % 28:02d}T{hour:02d}:{minute:02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z {level:5} {msg}"
        )
    return f"journalctl -u {domain['project']}-worker --since today --no-pager", "\n".join(out)


def grep_output(rng: random.Random, domain: Domain, matches: int) -> tuple[str, str]:
    name = rng.choice(functions(domain))
    out = []
    for _ in range(matches):
        module = rng.choice(domain["modules"])
        indent = "\t" if domain["code"] == "go" else "    "
        where = f"{module_path(domain, module)}:{rng.randint(1, 600)}:{indent}"
        if domain["code"] == "python":
            out.append(f"{where}result = {name}(session, {rng.randint(1, 999)})")
        elif domain["code"] == "rust":
            out.append(f"{where}    let v = self.{name}({rng.randint(1, 999)}).await?;")
        else:
            out.append(f"{where}v, err := s.{name}(ctx, id)")
    return f"rg -n '{name}' .", "\n".join(out)


def git_log(rng: random.Random, domain: Domain, commits: int) -> tuple[str, str]:
    out = []
    for i in range(commits):
        sha = "".join(rng.choice("0123456789abcdef") for _ in range(7))
        kind = rng.choice(("fix", "feat", "chore", "refactor", "test"))
        module = rng.choice(domain["modules"]).split("/")[-1]
        verb = rng.choice(domain["verbs"]).lower()
        who = rng.choice(domain["people"])
        out.append(
            f"{sha} {kind}({module}): {verb} {rng.choice(domain['entities']).replace('_', ' ')}s in batches ({who}, {1 + i % 28} days ago)"
        )
    return f"git log --oneline -n {commits}", "\n".join(out)


def listing(rng: random.Random, domain: Domain) -> tuple[str, str]:
    out = ["total 128"]
    for module in domain["modules"]:
        size = rng.randint(900, 48000)
        out.append(
            f"-rw-r--r--  1 dev dev {size:6d} Oct {rng.randint(1, 28):2d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {module_path(domain, module)}"
        )
    return "ls -la --recursive | head -40", "\n".join(out)
