"""HellaSwag items in its original jsonl format, written for the tests, and their writer."""
from __future__ import annotations

import json
from pathlib import Path


LONG_CTX = ("A man is standing on a ladder in front of a house. He is holding a paint roller and a bucket of "
            "paint. He dips the roller into the paint and starts painting the wall above the window, moving the "
            "roller up and down in long even strokes while a dog watches from the yard below. Then he")


# Six items in HellaSwag's original jsonl format (hellaswag_val.jsonl): written for these tests.
ITEMS = [
    {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles.",
     "ctx_b": "then", "ctx": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. then",
     "split": "val", "split_type": "indomain", "label": 3,
     "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.",
                 ", the man puts on a christmas coat, knitted with netting.", ", the man continues removing the snow on his car."],
     "source_id": "activitynet~v_-1IBHYS3L-Y"},
    {"ind": 17, "activity_label": "Baking cookies", "ctx_a": "A girl pours flour into a bowl.", "ctx_b": "she",
     "ctx": "A girl pours flour into a bowl. she", "split": "val", "split_type": "zeroshot", "label": 0,
     "endings": ["stirs it with a wooden spoon.", "jumps.", "throws the bowl at the television and laughs loudly for a long time.", "sleeps."],
     "source_id": "activitynet~v_test1"},
    {"ind": 25, "activity_label": "Personal Care and Style", "ctx_a": "[header] How to tie a tie [title] Drape the tie around your neck.",
     "ctx_b": "", "ctx": "[header] How to tie a tie [title] Drape the tie around your neck.", "split": "val",
     "split_type": "indomain", "label": 2,
     "endings": ["[step] Eat it.", "[step] Let it dry in the sun for three days before you wear it to work.",
                 "[step] The wide end should hang lower than the narrow end.", "[step] Paint the tie blue, é."],
     "source_id": "wikihow~1234"},
    {"ind": 31, "activity_label": "Painting", "ctx_a": LONG_CTX, "ctx_b": "", "ctx": LONG_CTX, "split": "val",
     "split_type": "indomain", "label": 1,
     "endings": ["falls.", "steps down, moves the ladder to the right and paints the next part of the wall.",
                 "eats the roller.", "flies to the moon on the bucket."],
     "source_id": "activitynet~v_test2"},
    {"ind": 40, "activity_label": "Playing piano", "ctx_a": "A woman sits at a piano.", "ctx_b": "she",
     "ctx": "A woman sits at a piano. she", "split": "val", "split_type": "zeroshot", "label": 1,
     "endings": ["is a piano.", "begins to play a song.", "sings", "closes the lid and walks away without playing anything at all."],
     "source_id": "activitynet~v_test3"},
    {"ind": 52, "activity_label": "Running a marathon", "ctx_a": "Runners line up at the start.", "ctx_b": "the runners",
     "ctx": "Runners line up at the start. the runners", "split": "val", "split_type": "indomain", "label": 0,
     "endings": ["start running when the gun fires.", "swim.", "take off their shoes and sit down.", "are 42 kilometres long."],
     "source_id": "activitynet~v_test4"},
]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
