"""The cues that name a statement's kind, in English, Chinese and Japanese: the tables
`policies.salience` scores sentences with.

A declarative table, apart from the scoring so that a new phrasing is added here without
touching how sentences are scored. Each kind's cues: English as patterns matched on word
boundaries, Chinese and Japanese as alternations (no word boundaries in CJK text). Matched on
the lower-cased sentence (no cue has an upper-case letter). Tuned on the evaluation corpus's
dev half only (docs/corpus.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Kind -> score of a sentence carrying that kind's cue. Order matters only for naming the kind
# of a sentence with several cues: the strongest one names it.
KIND_SCORES: dict[str, float] = {
    "prohibition": 0.9,
    "instruction": 0.85,
    "correction": 0.8,
    "constraint": 0.75,
    "decision": 0.75,
    "preference": 0.7,
    "goal": 0.7,
}


def words(*cues: str) -> tuple[str, ...]:
    """An English cue list: each cue a pattern, matched on word boundaries."""
    return cues


EN_CUES = {
    "prohibition": words(
        "never",
        r"do not",
        r"don'?t",
        r"must not",
        r"mustn'?t",
        r"shall not",
        r"should not",
        r"shouldn'?t",
        r"may not",
        r"cannot be",
        r"under no circumstances",
        "forbidden",
        "prohibited",
        r"not allowed",
        r"no one (?:may|should|can)",
        r"avoid(?:ing)?",
        r"stay away from",
        r"keep [\w\s]{1,30} out of",
        r"no [\w\s-]{1,40} (?:is|are) (?:allowed|permitted)",
    ),
    "instruction": words(
        "always",
        r"from now on",
        r"going forward",
        r"every time",
        "whenever",
        r"make sure",
        r"be sure to",
        "remember",
        r"keep in mind",
        r"ensure",
        r"each time",
        r"as a rule",
        r"stick (?:to|with)",
        r"important:",
        r"note:",
        r"every \w+ (?:needs|must|should|has to|gets)",
        r"(?:for|in|on) (?:every|each|all) \w+",
        r"by default",
        r"(?:ground |house )?rules?",
        r"conventions?",
        r"guidelines?",
        # a conditional rule: "if X, run Y" (a standing instruction, not a request for now)
        r"(?:if|when|whenever|once|before|after) [^,?.]{3,120}, (?:then |please |just |always "
        r"|first )?(?:run|use|ask|send|tell|ping|check|stop|keep|add|put|log|skip|retry|fall "
        r"back|notify|write|make|call|wait|do|don'?t|let me know|email|page)",
    ),
    "correction": words(
        "actually",
        "correction",
        r"i meant",
        r"i mean",
        r"scratch that",
        r"to clarify",
        r"that'?s wrong",
        r"that was wrong",
        r"i was wrong",
        r"i got (?:it|that) wrong",
        r"not \w+ but",
        r"instead of",
        r"rather than",
        r"change of plan",
        r"update:",
    ),
    "constraint": words(
        "must",
        r"has to",
        r"have to",
        r"needs?",
        r"requires?",
        "required",
        "requirement",
        r"at most",
        r"at least",
        r"no more than",
        r"no less than",
        r"no later than",
        "within",
        "only",
        "maximum",
        "minimum",
        "limit",
        "deadline",
        "budget",
        r"compatible with",
        "mandatory",
    ),
    "decision": words(
        r"we decided",
        r"i decided",
        "decided",
        r"we(?:'ll| will) (?:go with|use)",
        r"let'?s go with",
        r"we chose",
        r"we picked",
        r"settled on",
        "agreed",
        r"the decision",
        r"we'?re going with",
        r"let'?s (?:use|keep|do|stick with|go for|drop)",
    ),
    "preference": words(
        r"i prefer",
        "prefer",
        "preferably",
        r"i'?d rather",
        r"i like",
        r"i don'?t like",
        r"i want",
        r"i'?d like",
        r"please use",
        r"please keep",
        r"please write",
        "favou?r",
        "personally",
        r"i find",
    ),
    "goal": words(
        r"the goal",
        r"our goal",
        r"my goal",
        r"the aim",
        "objective",
        r"we want to",
        r"we need to",
        r"the plan is",
        r"our plan",
        r"the point is",
        r"in order to",
        r"so that",
        "target",
        "ultimately",
        "eventually",
        r"what i (?:really |ultimately )?want",
        r"end goal",
        r"long[- ]term",
    ),
}
# Each kind's English cues as one alternation on word boundaries (the plain form).
EN = {kind: r"\b(?:" + "|".join(cues) + r")\b" for kind, cues in EN_CUES.items()}


def by_first_letter(cues: Sequence[str]) -> str:
    """`cues` as one alternation on word boundaries, the cues that start with the same letter
    grouped under it (`n(?:ever|ot allowed)`): the same matches as the plain form, but at each
    word boundary the engine compares a couple of dozen first letters instead of trying every
    cue (about three times faster on a sentence)."""
    groups: dict[str, list[str]] = {}
    rest: list[str] = []
    for cue in cues:
        first = cue[:1]
        if first.isascii() and first.isalpha() and cue[1:2] not in ("?", "*", "+", "{"):
            groups.setdefault(first, []).append(cue[1:])
        else:
            rest.append(cue)
    parts = [f"{first}(?:{'|'.join(tails)})" for first, tails in groups.items()]
    return r"\b(?:" + "|".join([*parts, *rest]) + r")\b"


ZH = {
    "prohibition": (
        "不要|不能|不得|禁止|切勿|千万别|绝不|绝对不|不许|不允许|不可以|不准|别碰|别动|严禁|避免"
    ),
    "instruction": (
        "一定要|务必|始终|总是|每次|每周|每天|每月|记住|请确保|确保|从现在起|以后都|今后|一律|都用|统一|"
        "规则|约定|规矩|规范|如果.{1,40}，(?:先|就|要|请|必须|务必|一律|不要|别)"
    ),
    "correction": "其实|更正|我是说|我的意思是|不是.{1,12}而是|纠正|搞错|说错|改成|改为",
    "constraint": "必须|需要|至少|最多|不超过|不少于|截止|只能|只用|上限|下限|预算|以内|期限|"
    "都要|都得",
    "decision": "决定|我们选|选定|确定用|定了|采用|就用|敲定|就按|按方案|"
    "方案[一二三四五六七八九十]|不搞",
    "preference": "我喜欢|更喜欢|偏好|倾向于|我希望|请用|我想要|宁愿|就行|就好|简短|简洁",
    "goal": "目标|目的是|我们要|计划是|打算|为了",
}

JA = {
    "prohibition": (
        "しないで|しないこと|しないように|禁止|してはいけない|してはならない|てはいけ|てはなりません|"
        "ないでください|使わないで|触らないで|絶対に|ダメ|だめ|避けて|厳禁"
    ),
    "instruction": (
        "必ず|常に|いつも|毎回|毎週|毎日|毎月|覚えておいて|今後は|これからは|忘れずに|徹底|すべて|全て|"
        "ルール|決まり|約束|規約|(?:とき|時|場合|たら)は?、[^。？]*(?:ください|こと)"
    ),
    "correction": "訂正|間違い|間違えました|実は|ではなく|じゃなくて|言い間違い|修正します",
    "constraint": "必要|以内|以下|以上|までに|締め切り|締切|期限|のみ|だけ|上限|下限|予算|必須|"
    "\\d[^。？]{0,12}?まで",
    "decision": "決定|決めました|決めた|にします|にしました|採用|することにした|確定|"
    "ましょう|やめます|やめる",
    "preference": "好き|好み|がいい|の方がいい|希望|したい|ほしい|欲しい|でお願いします|"
    "短め|簡潔に",
    "goal": "目標|目的|ゴール|計画|狙い|ために",
}

# Matched on the lower-cased sentence rather than with re.I (no cue has an upper-case letter
# or class), English and CJK apart: the CJK cues only when the sentence has a CJK character
# (every one of them has one), the English ones only when it has a Latin letter.
CUES: tuple[tuple[str, re.Pattern[str], re.Pattern[str]], ...] = tuple(
    (kind, re.compile(by_first_letter(EN_CUES[kind])), re.compile(f"{ZH[kind]}|{JA[kind]}"))
    for kind in KIND_SCORES
)
# Every kind's cues in one pattern: one scan tells whether a sentence has a cue at all (most
# have none); only then are the kinds tried one by one, strongest first. (No named group per
# kind: a capturing group in the alternation makes the scan several times slower.)
ANY_EN = re.compile(by_first_letter([cue for kind in KIND_SCORES for cue in EN_CUES[kind]]))
ANY_CJK = re.compile("|".join(f"{ZH[kind]}|{JA[kind]}" for kind in KIND_SCORES))
