"""Synthetic chat data for the LoRA demo: free-text records of a person in, one line of JSON out.

Each example is one user turn and one assistant turn, in mlx-lm's `messages` chat format (one
JSON object a line, in `train.jsonl`, `valid.jsonl` and `test.jsonl`). The user writes a short
sentence about a person, made from a random name, age (18 to 79), city and job in one of several
phrasings ("Alice is 34 and lives in Paris; she works as a nurse.", "Meet Omar, a 51-year-old
plumber from Lagos.", ...); the assistant answers with exactly that person as JSON, always in the
same key order and spacing:

    {"name": "Alice", "age": 34, "city": "Paris", "job": "nurse"}

A small pretrained or instruction model does not answer like that by itself (it continues the
text or chats), but learns it in about 100 to 200 LoRA steps. The validation and test records
use first names the training records never do, so that an adapter is judged on copying names it
has not memorized. `--instruction TEXT` puts TEXT and a blank line before every record (no
instruction by default: the adapter learns the task from the examples alone).

The output depends only on the arguments: the same seed gives the same files, byte for byte.
Standard library only; nothing is downloaded.

Usage:
    python scripts/lora_demo_data.py --out /work/.models/lora-demo-data \
        [--train 400 --valid 50 --test 50 --seed 0] [--instruction "Extract the person as JSON."]
"""

import argparse
import json
import random
from pathlib import Path

# First names with the pronoun the phrasings use for them.
TRAIN_NAMES = [
    ("Alice", "she"), ("Bob", "he"), ("Carmen", "she"), ("David", "he"), ("Elena", "she"),
    ("Farid", "he"), ("Grace", "she"), ("Hiroshi", "he"), ("Ingrid", "she"), ("Jamal", "he"),
    ("Keiko", "she"), ("Lars", "he"), ("Maria", "she"), ("Nikolai", "he"), ("Olivia", "she"),
    ("Pedro", "he"), ("Quinn", "she"), ("Rahul", "he"), ("Sofia", "she"), ("Tomas", "he"),
    ("Uma", "she"), ("Victor", "he"), ("Wendy", "she"), ("Xavier", "he"), ("Yara", "she"),
    ("Zane", "he"), ("Amara", "she"), ("Bruno", "he"), ("Chloe", "she"), ("Diego", "he"),
    ("Emma", "she"), ("Felix", "he"), ("Hana", "she"), ("Ivan", "he"), ("Julia", "she"),
    ("Kofi", "he"), ("Leila", "she"), ("Marco", "he"), ("Nadia", "she"), ("Oscar", "he"),
]
# Names only the validation and test records use.
HELD_OUT_NAMES = [
    ("Priya", "she"), ("Omar", "he"), ("Beatrice", "she"), ("Kenji", "he"), ("Fatima", "she"),
    ("Lukas", "he"), ("Rosa", "she"), ("Samuel", "he"), ("Ines", "she"), ("Theo", "he"),
    ("Aisha", "she"), ("Mateo", "he"),
]
CITIES = [
    "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw",
    "Dublin", "Oslo", "Stockholm", "Helsinki", "Athens", "Istanbul", "Cairo", "Lagos",
    "Nairobi", "Cape Town", "Mumbai", "Delhi", "Bangkok", "Singapore", "Jakarta", "Manila",
    "Seoul", "Tokyo", "Osaka", "Beijing", "Shanghai", "Sydney", "Melbourne", "Auckland",
    "Toronto", "Vancouver", "Chicago", "Boston", "Denver", "Mexico City", "Lima", "Bogota",
    "Buenos Aires", "Santiago", "Montreal",
]
JOBS = [
    "nurse", "teacher", "plumber", "pilot", "chef", "lawyer", "dentist", "architect",
    "electrician", "accountant", "journalist", "baker", "pharmacist", "librarian", "firefighter",
    "carpenter", "photographer", "translator", "software engineer", "data analyst",
    "bus driver", "graphic designer", "veterinarian", "mechanic", "farmer", "musician",
    "police officer", "social worker", "civil engineer", "hairdresser", "painter", "economist",
]
# The ways a record is written: {name}, {age}, {city}, {job}, {a_job} ("a nurse", "an
# architect"), {pron} and {Pron}.
PHRASINGS = [
    "{name} is {age} and lives in {city}; {pron} works as {a_job}.",
    "Meet {name}, {a_job_age} from {city}.",
    "{name} ({age}) works as {a_job} in {city}.",
    "Living in {city}, {name} is {a_job} aged {age}.",
    "Our new colleague {name} is {age} years old, {a_job} based in {city}.",
    "{city} is home to {name}, {age}, who is {a_job}.",
    "Name: {name}. Age: {age}. City: {city}. Occupation: {job}.",
    "{name} turned {age} this year. {Pron} moved to {city} to work as {a_job}.",
    "I met {name} in {city}. {Pron} is {age} and {pron} is {a_job}.",
    "{name}, {job}, {age}, {city}.",
]


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def example(rng: random.Random, names, instruction: str | None) -> dict:
    name, pron = rng.choice(names)
    age = rng.randint(18, 79)
    city = rng.choice(CITIES)
    job = rng.choice(JOBS)
    a_job_age = f"{age}-year-old {job}"
    record = rng.choice(PHRASINGS).format(
        name=name,
        age=age,
        city=city,
        job=job,
        a_job=f"{article(job)} {job}",
        a_job_age=f"{article(a_job_age)} {a_job_age}",
        pron=pron,
        Pron=pron.capitalize(),
    )
    answer = json.dumps({"name": name, "age": age, "city": city, "job": job})
    user = f"{instruction}\n\n{record}" if instruction else record
    return {
        "messages": [
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the three files")
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--valid", type=int, default=50)
    parser.add_argument("--test", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instruction", help="text to put before every record")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    seen = set()
    splits = {}
    for split, count, names in [
        ("train", args.train, TRAIN_NAMES),
        ("valid", args.valid, HELD_OUT_NAMES),
        ("test", args.test, HELD_OUT_NAMES),
    ]:
        rows = []
        while len(rows) < count:
            ex = example(rng, names, args.instruction)
            # No user turn twice, within a split or across them.
            key = ex["messages"][0]["content"]
            if key in seen:
                continue
            seen.add(key)
            rows.append(ex)
        splits[split] = rows

    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        path = args.out / f"{split}.jsonl"
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{path}: {len(rows)} examples")


if __name__ == "__main__":
    main()
