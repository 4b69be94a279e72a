"""Synthetic but real-looking chat workloads (labelled synthetic in every result): requests, lengths, conversations."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

WORKLOAD_LABEL = "synthetic: templated chat requests with a seeded mix of lengths (not a recorded trace)"
LENGTH_MIX_LABEL = (
    "synthetic: log-normal prompt/output lengths shaped like ShareGPT chats (prompt median ~170, output median ~190 "
    "tokens), not a recorded trace"
)

TOPICS = [
    "hash tables",
    "the French Revolution",
    "photosynthesis",
    "binary search",
    "compound interest",
    "TCP handshakes",
    "sourdough baking",
    "black holes",
    "the water cycle",
    "unit testing",
    "the Roman Empire",
    "vaccines",
    "electric cars",
    "climate models",
    "public key cryptography",
    "coral reefs",
    "jazz harmony",
    "garbage collection",
    "supply and demand",
    "the immune system",
    "volcanoes",
    "SQL joins",
    "marathon training",
    "the printing press",
]
SHORT_QUESTIONS = [
    "What is {t}?",
    "Explain {t} in two sentences.",
    "Give me three facts about {t}.",
    "Why does {t} matter?",
    "Write a haiku about {t}.",
    "How would you teach {t} to a ten-year-old?",
]
LONG_ASKS = [
    "Summarise the notes above in three bullet points.",
    "What is the main argument of this text?",
    "List the open questions these notes leave.",
    "Rewrite the first paragraph more concisely.",
]
SENTENCES = [
    "The team met on Tuesday to review progress on {t}.",
    "Most of the discussion focused on {t} and its costs.",
    "Several people pointed out that earlier work on {t} had been rushed.",
    "A short presentation compared three approaches to {t}.",
    "The budget for the {t} project was approved.",
    "Nobody could agree on a timeline, so the decision on {t} was postponed.",
    "An outside expert on {t} will be invited to the next meeting.",
    "Measurements taken last month suggest the effect of {t} is smaller than expected.",
    "The draft report on {t} needs another round of edits before it is shared.",
    "Two new hires will join the group working on {t} in March.",
]
SYSTEM_PREAMBLE = (
    "You are Atlas, the support assistant of Northwind Outfitters, an online shop for hiking and camping gear. "
    "Answer politely and concisely, in the customer's language. Never invent order details: ask for the order "
    "number when you need it. "
)
SYSTEM_RULES = [
    "Shipping within the EU takes three to five working days; express shipping takes one to two.",
    "Returns are free within thirty days if the item is unused and in its original packaging.",
    "Tents, sleeping bags and backpacks carry a two-year warranty against manufacturing defects.",
    "Gift cards cannot be exchanged for cash and expire after three years.",
    "Customers can track parcels from the order page once the warehouse has handed them to the carrier.",
    "Do not give medical advice; for injuries, suggest contacting local emergency services.",
    "When a product is out of stock, offer to notify the customer when it is back.",
    "Loyalty members earn one point per euro spent and can redeem one hundred points for a five euro voucher.",
    "Price matching applies only to identical items sold by authorised retailers in the same country.",
    "If a customer is upset, acknowledge the problem before proposing a solution.",
]
DOCUMENT_QUESTIONS = [
    "What is this document about, in two sentences?",
    "Which decisions does the report record?",
    "Which topics come up most often?",
    "What was postponed, and why?",
    "Who will join the groups, and when?",
    "List three open questions the report leaves.",
    "What did the measurements suggest?",
    "Which budget was approved?",
]
FOLLOW_UPS = [
    "Thanks. And what about {t}?",
    "Can you say more about the second point?",
    "Could you give an example?",
    "That was helpful. How does that compare with last year?",
    "Please shorten your last answer.",
    "I ordered a tent two weeks ago and it still has not arrived. What can I do?",
    "Does the warranty cover a broken zipper?",
    "Can I return a sleeping bag I used once?",
]


@dataclass(frozen=True)
class ChatRequest:
    """One chat request: the messages and the max_tokens the client asks for."""

    messages: list[dict[str, str]] = field(hash=False)
    max_tokens: int
    kind: str  # short / medium / long


def chat_requests(num: int, seed: int = 0, max_tokens: int = 128) -> list[ChatRequest]:
    """`num` chat requests, a seeded mix of short questions (50%), medium (30%) and long documents (20%)."""
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        roll = rng.random()
        topic = rng.choice(TOPICS)
        if roll < 0.5:
            kind, text = "short", rng.choice(SHORT_QUESTIONS).format(t=topic)
        else:
            kind = "medium" if roll < 0.8 else "long"
            num_sentences = rng.randint(4, 8) if kind == "medium" else rng.randint(20, 40)
            notes = " ".join(rng.choice(SENTENCES).format(t=rng.choice(TOPICS)) for _ in range(num_sentences))
            text = f"Meeting notes:\n{notes}\n\n{rng.choice(LONG_ASKS)}"
        budget = rng.randint(max(1, max_tokens // 4), max_tokens)
        out.append(ChatRequest(messages=[{"role": "user", "content": text}], max_tokens=budget, kind=kind))
    return out


def lognormal_lengths(num: int, seed: int, median: float, sigma: float, lo: int, hi: int) -> list[int]:
    """`num` integer lengths from a log-normal with the given median and sigma, clipped to [lo, hi]."""
    rng = random.Random(seed)
    return [min(hi, max(lo, round(math.exp(rng.gauss(math.log(median), sigma))))) for _ in range(num)]


def length_mix(num: int, seed: int, max_model_len: int) -> list[tuple[int, int]]:
    """(prompt_len, output_len) pairs, ShareGPT-like; each pair fits in max_model_len."""
    prompts = lognormal_lengths(num, seed, median=170, sigma=1.0, lo=4, hi=max_model_len // 2)
    outputs = lognormal_lengths(num, seed + 1, median=190, sigma=0.8, lo=4, hi=max_model_len // 2)
    return [(p, min(o, max_model_len - p)) for p, o in zip(prompts, outputs, strict=True)]


def filler_token_ids(tokenizer: Any, num_tokens: int, seed: int = 0) -> list[int]:
    """Exactly `num_tokens` ids of real-looking prose (no special tokens), from seeded meeting notes."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < num_tokens:
        chunk = " ".join(rng.choice(SENTENCES).format(t=rng.choice(TOPICS)) for _ in range(20))
        ids.extend(tokenizer.encode(" " + chunk, add_special_tokens=False))
    return ids[:num_tokens]


def system_prompt(tokenizer: Any, num_tokens: int = 400) -> str:
    """A support-assistant system prompt of at most `num_tokens` tokens (short of it by less than a sentence)."""
    text = SYSTEM_PREAMBLE
    i = 0
    while True:
        candidate = text + SYSTEM_RULES[i % len(SYSTEM_RULES)] + " "
        if len(tokenizer.encode(candidate, add_special_tokens=False)) > num_tokens:
            break
        text, i = candidate, i + 1
        if i > 10 * num_tokens:  # a tokenizer that encodes nothing would loop forever
            raise RuntimeError("tokenizer produced no tokens for the system prompt")
    return text.rstrip()


def user_turns(user_index: int, num_turns: int, seed: int = 0) -> list[str]:
    """The `num_turns` messages one synthetic user sends, the first a fresh question, the rest follow-ups."""
    rng = random.Random(seed * 100_003 + user_index)
    first = rng.choice(SHORT_QUESTIONS).format(t=rng.choice(TOPICS))
    return [first] + [rng.choice(FOLLOW_UPS).format(t=rng.choice(TOPICS)) for _ in range(num_turns - 1)]


def long_user_turns(
    tokenizer: Any, user_index: int, num_turns: int, num_tokens: int, seed: int = 0
) -> list[str]:
    """The `num_turns` messages of one synthetic user who pastes about `num_tokens` tokens of notes each turn and
    asks about them (seeded meeting notes, different per user and turn)."""
    rng = random.Random(seed * 100_003 + user_index)
    out = []
    for k in range(num_turns):
        ask = rng.choice(LONG_ASKS)
        notes_tokens = max(1, num_tokens - len(tokenizer.encode(ask, add_special_tokens=False)) - 8)
        notes = tokenizer.decode(filler_token_ids(tokenizer, notes_tokens, seed=rng.randrange(2**31)))
        out.append(f"Notes, part {k + 1}:\n{notes.strip()}\n\n{ask}")
    return out


def document_turns(
    tokenizer: Any, user_index: int, num_turns: int, num_tokens: int, seed: int = 0
) -> list[str]:
    """The `num_turns` messages of one synthetic user who attaches a document of about `num_tokens` tokens (seeded
    meeting notes, different per user) in the first message and then asks questions about it."""
    rng = random.Random(seed * 100_003 + user_index)
    questions = [rng.choice(DOCUMENT_QUESTIONS) for _ in range(num_turns)]
    head = f"Here is our project report {user_index + 1}:\n\n"
    overhead = len(tokenizer.encode(head + "\n\n" + questions[0], add_special_tokens=False))
    notes = tokenizer.decode(
        filler_token_ids(tokenizer, max(1, num_tokens - overhead), seed=rng.randrange(2**31))
    )
    return [f"{head}{notes.strip()}\n\n{questions[0]}", *questions[1:]]
