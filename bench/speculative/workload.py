"""The chat workload `bench speculative` measures, fixed before any proposer is tuned on it (issue #40): what people
send a chat model where the reply repeats earlier text (code they pasted and want changed, a document to quote or
summarise, the previous answer to revise) and, as the control, open questions where it does not.

Each entry is a list of chat messages; `revise` entries carry an earlier assistant turn. The texts are written here
(not read from the repository) so that the workload does not change when the code does.
"""

from __future__ import annotations

CODE = '''def parse_duration(text):
    """Seconds in a duration such as '1h30m', '45s' or '2d'."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    total = 0
    number = ""
    for char in text.strip():
        if char.isdigit():
            number += char
        elif char in units and number:
            total += int(number) * units[char]
            number = ""
        else:
            raise ValueError(f"bad duration: {text!r}")
    if number:
        raise ValueError(f"a number without a unit in {text!r}")
    return total


def format_duration(seconds):
    """The shortest duration text for a number of seconds."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            count, seconds = divmod(seconds, size)
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
'''

DOCUMENT = """Meeting notes, platform team, Tuesday.

Attendees: Ana, Bilal, Chen, Dora. Ana opened with the incident from last Thursday: the nightly backup job of the
orders database ran for six hours instead of forty minutes because the replica it reads from was being rebuilt at
the same time. Nobody was paged because the job does not have a time limit. Bilal proposed adding a time limit of
two hours and an alert when the job is still running after ninety minutes. Chen pointed out that the rebuild of a
replica is a planned operation and should not overlap with backups at all; the calendar of maintenance windows is
kept in a spreadsheet that the backup scheduler does not read. Dora agreed to move the maintenance calendar into
the scheduler's configuration by the end of the month.

The second topic was the cost of the staging environment. Staging runs the same number of machines as production
although it serves a few hundred requests a day. Chen will reduce it to two machines per service, except for the
search service, which needs three for its index to fit. Ana asked that load tests be run against a separate
short-lived environment instead of staging; Bilal will write a script that creates one from the production
configuration and deletes it after eight hours.

Decisions: backups get a two-hour limit and an alert at ninety minutes (Bilal, this week); the maintenance
calendar moves into the scheduler (Dora, end of month); staging shrinks to two machines per service, search keeps
three (Chen, next week); load tests get their own environment (Bilal, next month).
"""

PREVIOUS_ANSWER = """To make a good cup of pour-over coffee, start with freshly roasted beans and grind them just
before brewing, to the size of coarse sand. Use about fifteen grams of coffee for every two hundred and fifty
grams of water. Heat the water to between ninety and ninety-six degrees Celsius. Rinse the paper filter with hot
water to remove its taste and warm the dripper, then discard that water. Add the ground coffee, pour just enough
water to wet it, and wait thirty seconds so that the coffee can release its gas. Then pour the rest of the water
slowly in circles, keeping the level steady, for about two minutes. The whole brew should take three to four
minutes. If it tastes sour, grind finer; if it tastes bitter, grind coarser."""

CATEGORIES: dict[str, list[list[dict[str, str]]]] = {
    "edit": [
        [
            {
                "role": "user",
                "content": f"{CODE}\nRename the function parse_duration to duration_seconds and show the whole code again.",
            }
        ],
        [{"role": "user", "content": f"{CODE}\nAdd type hints to both functions. Show the complete code."}],
        [
            {
                "role": "user",
                "content": f"{CODE}\nChange format_duration so that it puts a space between the parts, and print the full file.",
            }
        ],
    ],
    "quote": [
        [
            {
                "role": "user",
                "content": f"{DOCUMENT}\nList every decision from these notes, quoting each one exactly as written.",
            }
        ],
        [
            {
                "role": "user",
                "content": f"{DOCUMENT}\nWhat did Chen say about the replica rebuild? Quote the notes.",
            }
        ],
        [
            {
                "role": "user",
                "content": f"{DOCUMENT}\nSummarise the second topic of the meeting, reusing the notes' own sentences.",
            }
        ],
    ],
    "revise": [
        [
            {"role": "user", "content": "How do I make pour-over coffee?"},
            {"role": "assistant", "content": PREVIOUS_ANSWER},
            {"role": "user", "content": "Write that again, but use ounces instead of grams."},
        ],
        [
            {"role": "user", "content": "How do I make pour-over coffee?"},
            {"role": "assistant", "content": PREVIOUS_ANSWER},
            {"role": "user", "content": "Repeat your answer as a numbered list of steps."},
        ],
        [
            {"role": "user", "content": "How do I make pour-over coffee?"},
            {"role": "assistant", "content": PREVIOUS_ANSWER},
            {"role": "user", "content": "Say it again with Fahrenheit temperatures."},
        ],
    ],
    "open": [
        [{"role": "user", "content": "Why do cats purr?"}],
        [
            {
                "role": "user",
                "content": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            }
        ],
        [{"role": "user", "content": "What are the pros and cons of working from home?"}],
    ],
}
