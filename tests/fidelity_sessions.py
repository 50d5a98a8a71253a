"""Generated sessions with planted statements, for the fidelity benchmark and its tests.

A session is what a chat app or a coding agent resends: a system prompt, then user turns. Early
on (in the first fifth, the hard case: the part compaction removes first) and now and then later,
the user states something that must hold for the rest of the session, one statement of each
type (prohibition, instruction, correction, constraint, decision, preference, goal, fact),
often inside a message with routine sentences around it. Everything else is realistic filler:
routine requests, acknowledgements, the assistant's prose, and in the `agent` shape tool calls
with their outputs (logs, code, listings full of paths and numbers). The last user message is a
generic "continue", which makes relevance to the latest message useless.

Deterministic: a session is a function of (seed, language, shape, turns). English, Chinese and
Japanese, each with templates written for that language (not translated word for word).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

Language = Literal["en", "zh", "ja"]
Shape = Literal["chat", "agent"]
LANGUAGES: tuple[Language, ...] = ("en", "zh", "ja")
SHAPES: tuple[Shape, ...] = ("chat", "agent")

# Per language and type: templates for one planted statement. {n}, {m}: numbers; {name}: a
# person; {path}: a file; {host}: an address; {tool}: a technology.
PLANTED: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "prohibition": (
            "Never touch the production database without asking me first.",
            "Do not push directly to the {branch} branch.",
            "Don't delete anything under {path}, it is shared with another team.",
        ),
        "instruction": (
            "Always run the linter before you commit.",
            "From now on, write every commit message in the imperative mood.",
            "Make sure every new endpoint has a test.",
        ),
        "correction": (
            "Actually, the service listens on port {n}, not 8080.",
            "Correction: the customer is {name}, not the one I mentioned before.",
            "I meant the {branch} branch, not main.",
        ),
        "constraint": (
            "The response time must stay under {m} ms at the 99th percentile.",
            "We have a budget of at most ${n} per month for hosting.",
            "The migration has to finish before {month} {day}.",
        ),
        "decision": (
            "We decided to use {tool} for the job queue.",
            "Let's go with the second design, the one with a single writer.",
            "We chose to keep the API version at v{v} until the release.",
        ),
        "preference": (
            "I prefer small pull requests over one big one.",
            "I'd rather have explicit type hints everywhere.",
            "Please use tabs in the Makefile and four spaces elsewhere.",
        ),
        "goal": (
            "The goal is to cut the cold start time to {m} ms.",
            "Our goal this week is to ship the export feature to {name}'s team.",
            "The plan is to replace the cron jobs with {tool} by the end of the quarter.",
        ),
        "fact": (
            "The staging server is at {host} and the admin account is called deploy_bot.",
            "Our main customer is {name} at Northwind Traders, account ID NW-{n}.",
            "The config file lives in {path} and the logs go to /var/log/app/{name_l}.log.",
        ),
    },
    "zh": {
        "prohibition": (
            "千万不要直接修改生产数据库，先问我。",
            "不要往{branch}分支直接推送代码。",
            "禁止删除{path}下的任何文件，那是另一个团队共用的。",
        ),
        "instruction": (
            "每次提交之前务必先运行代码检查。",
            "从现在起，所有提交信息都用英文写。",
            "一定要给每个新接口写测试。",
        ),
        "correction": (
            "更正一下，服务监听的端口是{n}，不是8080。",
            "我说错了，客户是{name_zh}，不是我之前提到的那位。",
            "其实是{branch}分支，不是main分支。",
        ),
        "constraint": (
            "接口的99分位响应时间必须低于{m}毫秒。",
            "托管费用每月最多{n}元。",
            "数据迁移必须在{month_n}月{day}日之前完成。",
        ),
        "decision": (
            "我们决定用{tool}做任务队列。",
            "我们选第二个方案，也就是只有一个写入者的那个。",
            "我们决定在发布之前把接口版本保持在v{v}。",
        ),
        "preference": (
            "我更喜欢小的合并请求，而不是一个大的。",
            "我希望所有函数都写上明确的类型标注。",
            "我偏好用四个空格缩进，Makefile里用制表符。",
        ),
        "goal": (
            "我们的目标是把冷启动时间降到{m}毫秒。",
            "本周的目标是把导出功能交付给{name_zh}的团队。",
            "计划是在本季度末之前用{tool}替换所有定时任务。",
        ),
        "fact": (
            "测试服务器的地址是{host}，管理员账号叫deploy_bot。",
            "我们的主要客户是{name_zh}，账号编号是NW-{n}。",
            "配置文件在{path}，日志写到/var/log/app/{name_l}.log。",
        ),
    },
    "ja": {
        "prohibition": (
            "本番データベースには絶対に触らないでください。",
            "{branch}ブランチに直接プッシュしないでください。",
            "{path}の下のファイルは削除禁止です。別のチームと共有しています。",
        ),
        "instruction": (
            "コミットする前に必ずリンターを実行してください。",
            "今後はコミットメッセージをすべて英語で書いてください。",
            "新しいエンドポイントには必ずテストを書いてください。",
        ),
        "correction": (
            "訂正します。サービスのポートは{n}で、8080ではありません。",
            "顧客は{name_ja}さんです。前に言った方ではなく、こちらが正しいです。",
            "実は{branch}ブランチのことで、mainではありません。",
        ),
        "constraint": (
            "99パーセンタイルの応答時間は{m}ミリ秒以内にする必要があります。",
            "ホスティング費用は月{n}円以下に抑えてください。",
            "移行は{month_n}月{day}日までに終わらせる必要があります。",
        ),
        "decision": (
            "ジョブキューには{tool}を使うことにしました。",
            "二つ目の設計、書き込みが一つだけの方を採用することに決めました。",
            "リリースまではAPIのバージョンをv{v}のままにすることに決定しました。",
        ),
        "preference": (
            "大きなプルリクエストより小さいものの方がいいです。",
            "型ヒントはすべての関数に明示的に書いてほしいです。",
            "インデントはスペース四つが好みです。Makefileだけはタブにしてください。",
        ),
        "goal": (
            "目標はコールドスタートを{m}ミリ秒まで短くすることです。",
            "今週の目標は{name_ja}さんのチームにエクスポート機能を届けることです。",
            "計画では四半期末までにcronジョブを{tool}に置き換えます。",
        ),
        "fact": (
            "ステージングサーバーは{host}にあり、管理者アカウントはdeploy_botです。",
            "主要な顧客は{name_ja}さんで、アカウントIDはNW-{n}です。",
            "設定ファイルは{path}にあり、ログは/var/log/app/{name_l}.logに出ます。",
        ),
    },
}
TYPES = tuple(PLANTED["en"])

# Routine user sentences: requests for now, acknowledgements, questions. They carry no durable
# statement (some mention paths or numbers, as real requests do).
ROUTINE: dict[str, tuple[str, ...]] = {
    "en": (
        "Ok, thanks.",
        "Looks good.",
        "Run the tests again.",
        "Can you show me the diff?",
        "What does this error mean?",
        "Open src/handlers/export.py and look at the second function.",
        "Try it once more with verbose output.",
        "Hmm, that did not work.",
        "Let's look at the next failing case.",
        "Why is this test slow?",
        "Sounds good, go ahead.",
        "Can you explain what the retry loop does?",
    ),
    "zh": (
        "好的，谢谢。",
        "看起来不错。",
        "再运行一次测试。",
        "能给我看一下改动吗？",
        "这个报错是什么意思？",
        "打开src/handlers/export.py看看第二个函数。",
        "加上详细输出再试一次。",
        "嗯，还是不行。",
        "看看下一个失败的用例。",
        "为什么这个测试这么慢？",
        "可以，继续吧。",
        "能解释一下重试循环是做什么的吗？",
    ),
    "ja": (
        "了解です。ありがとう。",
        "良さそうですね。",
        "もう一度テストを実行して。",
        "差分を見せてもらえますか？",
        "このエラーはどういう意味ですか？",
        "src/handlers/export.pyを開いて二つ目の関数を見て。",
        "詳細な出力でもう一度試して。",
        "うーん、うまくいきませんでした。",
        "次の失敗しているケースを見ましょう。",
        "このテストはなぜ遅いのですか？",
        "いいですね、進めてください。",
        "リトライのループが何をしているか説明してもらえますか？",
    ),
}
CONTINUE = {
    "en": "Continue with the plan.",
    "zh": "继续按计划进行。",
    "ja": "計画どおり続けてください。",
}
SYSTEM = {
    "en": "You are a careful software engineering assistant.",
    "zh": "你是一个细心的软件工程助手。",
    "ja": "あなたは慎重なソフトウェアエンジニアリングのアシスタントです。",
}
ASSISTANT = {
    "en": (
        "I looked at the code path you mentioned. The handler reads the request, validates the "
        "payload, and then hands it to the worker pool; the slow part is the serialisation step, "
        "which copies the whole buffer twice. I can rewrite it to stream the rows instead. "
    ),
    "zh": (
        "我看了你提到的代码路径。处理函数先读取请求、校验数据，然后交给工作线程池；慢的地方在序列化"
        "那一步，它把整个缓冲区复制了两次。我可以改成逐行流式输出。"
    ),
    "ja": (
        "ご指摘のコードパスを確認しました。ハンドラーはリクエストを読み込み、ペイロードを検証してから"
        "ワーカープールに渡します。遅いのはシリアライズの部分で、バッファ全体を二回コピーしています。"
        "行ごとにストリーミングするように書き換えられます。"
    ),
}
NAMES = ("Maria Lopez", "Kenji Sato", "Priya Raman", "Tom Becker", "Ana Costa")
NAMES_ZH = ("王芳", "李强", "张伟", "陈静", "刘洋")
NAMES_JA = ("佐藤", "鈴木", "高橋", "田中", "伊藤")
TOOLS = ("Redis", "RabbitMQ", "Celery", "Kafka", "Temporal")
BRANCHES = ("release", "staging", "hotfix", "develop")
MONTHS = ("March", "April", "June", "September", "November")


@dataclass(frozen=True)
class Planted:
    """One statement the session must not lose: its type and its exact text."""

    kind: str
    text: str


@dataclass(frozen=True)
class Session:
    seed: int
    language: Language
    shape: Shape
    messages: list[dict[str, Any]]
    planted: list[Planted]


def session(seed: int, language: Language, shape: Shape, turns: int = 40) -> Session:
    """A session of `turns` user turns with one statement of each type planted in it: most in
    the first fifth, the rest spread over the middle; the last message says "continue"."""
    rng = random.Random(f"{seed}|{language}|{shape}")
    fill = _fill(rng)
    statements = [
        Planted(kind, rng.choice(PLANTED[language][kind]).format(**fill)) for kind in TYPES
    ]
    rng.shuffle(statements)
    early = max(2, turns // 5)
    slots = sorted(rng.sample(range(early), min(early, 6)))
    later = range(early, max(early + len(statements), turns * 3 // 4))
    slots += sorted(rng.sample(later, len(statements) - len(slots)))
    if slots[-1] >= turns - 1:
        raise ValueError(f"{turns} turns are too few for {len(statements)} statements")
    where = dict(zip(slots, statements, strict=False))
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM[language]}]
    for t in range(turns - 1):
        routine = rng.choice(ROUTINE[language])
        planted = where.get(t)
        if planted is None:
            text = routine
        elif rng.random() < 0.5:  # said among routine sentences
            text = f"{routine} {planted.text} {rng.choice(ROUTINE[language])}"
        else:
            text = planted.text
        messages.append({"role": "user", "content": text})
        if shape == "agent":
            messages.extend(_tool_round(rng, t))
        messages.append({"role": "assistant", "content": ASSISTANT[language] * rng.randint(1, 3)})
    messages.append({"role": "user", "content": CONTINUE[language]})
    return Session(seed, language, shape, messages, statements)


def _fill(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(NAMES)
    return {
        "n": rng.randint(3000, 9999),
        "m": rng.choice((120, 150, 200, 250, 300)),
        "v": f"{rng.randint(1, 4)}.{rng.randint(0, 9)}",
        "name": name,
        "name_l": name.split()[0].lower(),
        "name_zh": rng.choice(NAMES_ZH),
        "name_ja": rng.choice(NAMES_JA),
        "path": rng.choice(("/srv/shared/exports", "config/prod.yaml", "/etc/app/secrets")),
        "host": f"10.{rng.randint(0, 9)}.{rng.randint(0, 255)}.{rng.randint(2, 250)}",
        "tool": rng.choice(TOOLS),
        "branch": rng.choice(BRANCHES),
        "month": rng.choice(MONTHS),
        "month_n": rng.randint(1, 12),
        "day": rng.randint(1, 28),
    }


def _tool_round(rng: random.Random, t: int) -> list[dict[str, Any]]:
    """One tool call and its output: a listing, a log or a test run, 20-60 lines."""
    call_id = f"call_{t}"
    name = rng.choice(("run_shell", "read_file", "run_tests"))
    lines = []
    for i in range(rng.randint(20, 60)):
        lines.append(
            rng.choice(
                (
                    f"src/module_{i % 7}/handler_{i}.py:{rng.randint(1, 400)}: ok",
                    f"2026-11-{rng.randint(1, 28):02d} 10:{i % 60:02d}:00 INFO worker {i} took "
                    f"{rng.randint(2, 900)} ms",
                    f"test_case_{i} PASSED ({rng.randint(1, 99)}%)",
                    f"-rw-r--r-- 1 dev dev {rng.randint(100, 99999)} Nov {i % 28 + 1} file_{i}.txt",
                )
            )
        )
    arguments = '{"command": "make test"}' if name != "read_file" else '{"path": "src/app.py"}'
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)},
    ]


def survived(planted: Planted, forwarded_text: str) -> bool:
    """Whether the statement is still there, word for word (whitespace and case aside)."""
    return " ".join(planted.text.split()).casefold() in forwarded_text


def forwarded_text(messages: list[dict[str, Any]]) -> str:
    """Every text of the forwarded messages, in the form `survived` compares against."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
    return "\n".join(" ".join(p.split()).casefold() for p in parts)
