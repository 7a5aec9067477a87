"""Probe queries that no capability registry serves, for calibrating abstention per catalog.

How close the nearest capability is to a request that needs none depends on the catalog: a
catalog of thousands of broad tools has something loosely near everything, a small one does not.
Each index embeds these probes and measures how close its catalog comes to them (the
``probe_quantile`` of their best cosines); a query whose best match is no closer than that is
answered "nothing fits". The probes are small talk, general knowledge, writing and arithmetic,
none of them close to a tool. They are kept apart from the no-tool queries the benchmarks
evaluate with (``benchmarks/no_tool_queries.jsonl``).
"""

from __future__ import annotations

PROBES: tuple[str, ...] = (
    "Hi, how is your day going so far?",
    "Thank you so much, that's all I needed.",
    "What is the boiling point of water at sea level?",
    "Who painted the Mona Lisa?",
    "Write a limerick about a forgetful wizard.",
    "Explain the concept of irony with an example.",
    "What is 45 divided by 9?",
    "Why do leaves change colour in the fall?",
    "Can you give me some advice on being more patient?",
    "What's the difference between 'affect' and 'effect'?",
    "Tell me something funny to cheer me up.",
    "How many legs does a spider have?",
    "What do you think makes a good friend?",
    "Describe the smell of rain in one sentence.",
    "Is it better to read fiction or non-fiction?",
    "Who was the first person to walk on the moon?",
    "Explain what gravity is to a child.",
    "What rhymes with orange?",
    "Give me a fun fact about the Roman Empire.",
    "Okay, see you later!",
    "Why do we dream when we sleep?",
    "What is the opposite of generous?",
    "Can you write a two-line poem about coffee?",
    "What are the primary colours?",
)
