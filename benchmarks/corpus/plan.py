"""A session's events: where the statements go, what the user asks between them, which tools
the agent runs, and the final question with what it depends on.

Most statements land in the first 40 % of the user's turns (the part compaction removes
first), the rest later; a statement is typed alone, before or after a routine request, or (in
chat and Aider) after a pasted log in the same message. Between them: routine requests,
filler and acknowledgements, and in the agent shapes tool steps whose outputs are generated
by `material` and framed as that agent frames them (`shapes.tool_output`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from . import Call, Content, Event, Item, Paste, Reply, Say, Session, Step, load, material, shapes

# Per shape: user turns, tool steps per working turn (min, max), output scale.
TURNS = {"aider": 16, "codex": 8, "claude_code": 10, "opencode": 9, "chat": 34}
STEPS = {
    "aider": (0, 0),
    "codex": (1, 3),
    "claude_code": (1, 3),
    "opencode": (1, 3),
    "chat": (0, 0),
}
# Functions in a source file read by a tool, and lines of a log: Codex's outputs are the
# ~6k-token ones seen from Codex CLI; Claude Code and OpenCode read smaller pieces.
SCALE = {"codex": 1.0, "claude_code": 0.6, "opencode": 0.5}


def _fill(rng: random.Random, template: str, domain: Mapping[str, Any]) -> str:
    funcs = material.functions(domain)
    path = material.module_path(domain, rng.choice(domain["modules"]))
    func, other = rng.choice(funcs), rng.choice(funcs) + "_v2"
    return template.replace("{file}", path).replace("{func2}", other).replace("{func}", func)


def _places(rng: random.Random, count: int, turns: int) -> list[int]:
    """Distinct user-turn indexes (not the last one) for `count` statements: about 70 % in
    the first 40 % of the session."""
    early = list(range(0, max(2, int(turns * 0.4))))
    late = list(range(len(early), turns - 1))
    rng.shuffle(early)
    rng.shuffle(late)
    n_early = min(len(early), max(1, round(count * 0.7)))
    picked = early[:n_early] + late[: count - n_early]
    while len(picked) < count:  # more statements than turns: share turns
        picked.append(rng.randrange(turns - 1))
    return picked


def _call(
    rng: random.Random,
    shape: str,
    flavor: str,
    domain: Mapping[str, Any],
    n: int,
    files: dict[str, str],
) -> Call:
    scale = SCALE[shape]
    kind = rng.choice(("read", "read", "test", "log", "grep", "git", "ls"))
    if kind == "read":
        module = rng.choice(domain["modules"])
        path = material.module_path(domain, module)
        if path not in files:
            files[path] = material.source_file(rng, domain, module, max(6, int(34 * scale)))
        text = shapes.tool_output(shape, "read", path, files[path], n, flavor)
        start = text.index(files[path]) if files[path] in text else 0  # numbered reads: 0
        return Call(f"c{n}", "read", path, Content(f"read:{path}", text, start))
    if kind == "test":
        command, raw = material.test_log(rng, domain, int(420 * scale), rng.randint(1, 4))
    elif kind == "log":
        command, raw = material.service_log(rng, domain, int(230 * scale))
    elif kind == "grep":
        command, raw = material.grep_output(rng, domain, int(90 * scale))
    elif kind == "git":
        command, raw = material.git_log(rng, domain, int(120 * scale))
    else:
        command, raw = material.listing(rng, domain)
    command = f"{command}  # {n}" if kind == "ls" else command
    text = shapes.tool_output(shape, "shell", command, raw, n, flavor)
    return Call(f"c{n}", "shell", command, Content(f"shell:{command}", text, text.index(raw)))


def build(
    half: str,
    shape: str,
    language: str,
    seed: int,
    chosen: Sequence[tuple[Mapping[str, Any], tuple[Item, ...]]],
) -> Session:
    rng = random.Random(f"{half}/{shape}/{language}/{seed}")
    lang = load(half)["languages"][language]
    domain = lang["domain"]
    turns = TURNS[shape]
    places = _places(rng, len(chosen), turns)
    at: dict[int, list[int]] = {}
    for k, turn in enumerate(places):
        at.setdefault(turn, []).append(k)
    events: list[Event] = []
    pastes: list[Content] = []
    calls: list[tuple[int, Call]] = []  # (user turn, call)
    read_files: dict[str, str] = {}
    call_no = 0
    flavor = "qwen" if shape == "opencode" and seed % 2 else ""
    for turn in range(turns - 1):
        says = [chosen[k][0]["say"] for k in at.get(turn, [])]
        task = _fill(rng, rng.choice(lang["tasks"]), domain)
        working = shape not in ("chat", "aider") and (says or rng.random() < 0.75)
        if says:
            text = "\n\n".join(says)
            style = rng.random()
            if shape in ("chat", "aider") and style < 0.2:
                command, raw = (
                    material.test_log(rng, domain, 60, 1)
                    if rng.random() < 0.5
                    else material.service_log(rng, domain, 40)
                )
                content = Content(f"paste:{command}", raw)
                events.append(Paste(rng.choice(lang["paste_intro"]), content, text))
                pastes.append(content)
            elif style < 0.45:
                events.append(Say(f"{task} {text}" if language == "en" else f"{task}{text}"))
            elif style < 0.7:
                events.append(Say(f"{text}\n\n{task}"))
            else:
                events.append(Say(text))
        elif shape in ("chat", "aider") and rng.random() < 0.15:
            command, raw = (
                material.test_log(rng, domain, 80, 2)
                if rng.random() < 0.5
                else material.service_log(rng, domain, 70)
            )
            content = Content(f"paste:{command}", raw)
            events.append(Paste(rng.choice(lang["paste_intro"]), content))
            pastes.append(content)
        elif working or rng.random() < 0.6:
            events.append(Say(task))
        else:
            events.append(Say(rng.choice(lang["filler"])))
        if working:
            low, high = STEPS[shape]
            for _ in range(rng.randint(low, high)):
                batch = []
                for _ in range(1 if rng.random() < 0.7 else 2):
                    call = _call(rng, shape, flavor, domain, call_no, read_files)
                    call_no += 1
                    batch.append(call)
                    calls.append((turn, call))
                events.append(Step(_fill(rng, rng.choice(lang["tasks"]), domain), tuple(batch)))
        parts = rng.randint(2, 4) if shape == "chat" else 1
        reply = "\n\n".join(_fill(rng, rng.choice(lang["assistant"]), domain) for _ in range(parts))
        events.append(Reply(shapes.edit_block(shape, rng, domain, reply)))

    items = tuple(i for _, its in chosen for i in its)
    head = shapes.head(shape, rng, half, language, domain, lang)
    head["flavor"] = flavor
    files = tuple(head.get("files", ()))
    cleared: set[str] = set()
    if shape == "claude_code":  # its micro-compaction, at about 60 % of the session
        head["clear_at"] = clear_at = int(len(events) * 0.6)
        before = [c.call_id for e in events[:clear_at] if isinstance(e, Step) for c in e.calls]
        cleared = set(before[:-3])
        head["cleared"] = sorted(cleared)
    # The final question and what it depends on.
    early = sorted((turn, k) for k, turn in enumerate(places))
    statement, its = chosen[early[0][1]]
    question, depends = statement["ask"], tuple(its)
    if seed % 2 == 0 and shape == "aider":
        question, depends = lang["file_question"], files
    elif seed % 2 == 0 and calls:
        shown = [shapes.shown(shape, c) for _, c in calls]
        named = [c for _, c in calls if shown.count(shapes.shown(shape, c)) == 1]  # unambiguous
        kept = [c for c in named if c.call_id not in cleared]
        target = (kept or named or [c for _, c in calls])[0]
        question = lang["tool_question"].format(command=shapes.shown(shape, target))
        depends = (target.output,)
    elif seed % 2 == 1 and shape == "chat" and pastes:
        question, depends = lang["paste_question"], (pastes[0],)
    events.append(Say(question))
    return Session(
        id=f"{half}-{shape}-{language}-{seed}",
        half=half,
        shape=shape,
        language=language,
        events=tuple(events),
        items=items,
        depends_on=depends,
        files=files,
        head=head,
    )
