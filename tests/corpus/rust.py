"""The fresh half's code: Rust source files (an sqlx service per module) and `cargo test`
output, generated from a domain's vocabulary like the rest of `material` (which calls these).
Rust because neither of the other halves uses it: a rule tuned on the shape of Python or Go
lines is not silently tested on the same shape."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from .names import camel

Domain = Mapping[str, Any]


def _function(rng: random.Random, domain: Domain, name: str, entity: str) -> list[str]:
    fields = rng.sample(domain["fields"], 4)
    cls = camel(entity)
    lines = [
        f"    /// {name.replace('_', ' ').capitalize()} for one {entity.replace('_', ' ')}.",
        f"    pub async fn {name}(&self, id: i64) -> Result<{cls}, Error> {{",
        f'        let row: {cls} = sqlx::query_as("SELECT {", ".join(fields)} FROM {entity}s WHERE id = $1")',
        "            .bind(id)",
        "            .fetch_one(&self.pool)",
        "            .await",
        f'            .map_err(|e| Error::Db(format!("{name} {{id}}: {{e}}")))?;',
    ]
    for _ in range(rng.randint(2, 6)):
        field = rng.choice(fields)
        limit = rng.choice((0, 1, 100, 250, 1000, 86400))
        lines += [
            f"        if row.{field}.len() > {limit} {{",
            f'            warn!(field = "{field}", id, "{name}_clipped");',
            "        }",
        ]
    if rng.random() < 0.4:
        lines.append(f"        {rng.choice(domain['comment_rules'])}")
    lines += [
        f"        sqlx::query(UPDATE_{entity.upper()})",
        "            .bind(id)",
        f'            .bind("{rng.choice(("ready", "done", "queued", "failed"))}")',
        "            .execute(&self.pool)",
        "            .await?;",
        f"        self.metrics.{entity}_total.inc();",
        f'        info!(id, elapsed_ms = started.elapsed().as_millis() as u64, "{name}");',
        "        Ok(row)",
        "    }",
        "",
    ]
    return lines


def source_file(rng: random.Random, domain: Domain, module: str, functions_count: int) -> str:
    entities = rng.sample(domain["entities"], 3)
    verbs = rng.sample(domain["verbs"], min(len(domain["verbs"]), functions_count))
    lines = [
        f"//! {module.split('/')[-1].replace('_', ' ').capitalize()} for {domain['project']}.",
        "",
        "use std::sync::Arc;",
        "use std::time::Instant;",
        "",
        "use serde::Serialize;",
        "use sqlx::PgPool;",
        "use tracing::{info, warn};",
        "",
        "use crate::error::Error;",
        "use crate::metrics::Registry;",
        "",
        "pub struct Service {",
        "    pool: PgPool,",
        "    metrics: Arc<Registry>,",
        "}",
        "",
    ]
    for entity in entities:
        lines += [
            "#[derive(Debug, Clone, Serialize, sqlx::FromRow)]",
            f"pub struct {camel(entity)} {{",
        ]
        for field in domain["fields"][:6]:
            lines.append(f"    pub {field}: String,")
        lines += [
            "}",
            "",
            f'const UPDATE_{entity.upper()}: &str = "UPDATE {entity}s SET status = $2 WHERE id = $1";',
            "",
        ]
    lines.append("impl Service {")
    for i in range(functions_count):
        entity = entities[i % len(entities)]
        verb = verbs[i % len(verbs)]
        suffix = "" if i < len(verbs) else str(i // len(verbs) + 1)
        body = _function(rng, domain, f"{verb}_{entity}{suffix}", entity)
        body.insert(2, "        let started = Instant::now();")
        lines += body
    lines.append("}")
    return "\n".join(lines) + "\n"


def cargo_test(
    rng: random.Random, domain: Domain, names: list[str], cases: int, failing: set[int]
) -> tuple[str, str]:
    """`cargo test` output: one line per test, then each failure's panic, then the summary."""
    tests = []
    for i in range(cases):
        module = rng.choice(domain["modules"]).replace("/", "::")
        tests.append(f"{module}::tests::{names[(i * 7) % len(names)]}_{i}")
    lines = [
        "   Compiling " + domain["package"] + " v0.14.2 (/home/dev/" + domain["project"] + ")",
        f"    Finished `test` profile [unoptimized + debuginfo] target(s) in {rng.uniform(8, 90):.2f}s",
        f"     Running unittests src/lib.rs (target/debug/deps/{domain['package']}-{rng.getrandbits(64):016x})",
        "",
        f"running {cases} tests",
    ]
    lines += [f"test {t} ... {'FAILED' if i in failing else 'ok'}" for i, t in enumerate(tests)]
    lines += ["", "failures:", ""]
    for i in sorted(failing):
        path = "src/" + tests[i].split("::tests::")[0].replace("::", "/") + ".rs"
        lines += [
            f"---- {tests[i]} stdout ----",
            f"thread '{tests[i]}' panicked at {path}:{rng.randint(20, 400)}:9:",
            "assertion `left == right` failed",
            '  left: "failed"',
            ' right: "ready"',
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
            "",
        ]
    lines += ["", "failures:"] + [f"    {tests[i]}" for i in sorted(failing)]
    verdict = "FAILED" if failing else "ok"
    lines += [
        "",
        f"test result: {verdict}. {cases - len(failing)} passed; {len(failing)} failed; 0 ignored; "
        f"0 measured; 0 filtered out; finished in {rng.uniform(0.5, 30):.2f}s",
    ]
    if failing:
        lines += ["", "error: test failed, to rerun pass `--lib`"]
    return "cargo test --workspace", "\n".join(lines)
