"""A few paragraphs of plain English to train the demo checkpoints' tokenizer on."""

from __future__ import annotations

DEMO_CORPUS = """\
The capital of France is Paris, a city on the river Seine. Many people visit it every year.
The capital of Italy is Rome, and the capital of Spain is Madrid. Berlin is in Germany.
Once upon a time there was a small village at the edge of a great forest. The people who lived
there were farmers, and every morning they walked out to their fields before the sun came up.
In the evening they sat together, told stories, and watched the stars appear one by one.
A language model reads a sequence of tokens and predicts the next one. It is trained on a large
amount of text, and it learns which words tend to follow which. When it generates, it picks a
token, adds it to the sequence, and repeats, until it reaches a stop token or a length limit.
Serving many users at once is a matter of batching: the server gathers the requests that are
waiting, runs them through the model together, and streams each answer back as it grows.
Adapters are small sets of extra weights. Each customer can train their own adapter, and the
server can apply a different one to every request in the same batch.
Numbers matter too: 1, 2, 3, 10, 42, 100, 2024, 3.14, and 1,000,000 appear in ordinary text.
Questions end with a question mark? Exclamations end with an exclamation mark! Lists use commas,
semicolons; colons: and dashes - like these. Quotes look "like this" and 'like this'.
Water boils at one hundred degrees and freezes at zero. The sun rises in the east and sets in
the west. A week has seven days, a year has twelve months, and a day has twenty-four hours.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. Good morning,
good afternoon, good evening, and good night. Thank you very much; you are welcome.
def add(a, b):
    return a + b
for item in items:
    print(item)
The assistant answered the question politely and then asked whether there was anything else the
user wanted to know about the weather, the history of the city, or the best place to eat dinner.
"""
