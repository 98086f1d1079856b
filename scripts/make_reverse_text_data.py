"""Write the offline reverse-text dataset shipped in the package.

Source of text: the word list below, written for this project and released with it
(Apache-2.0, like the rest of vf-rl): common English words, no third-party text.
Each example is a short phrase of ``--min-words`` to ``--max-words`` words drawn with a
fixed seed, so the files are reproducible:

    python scripts/make_reverse_text_data.py

writes ``src/vf_rl/environments/reverse_text/data/{train,eval}.jsonl`` with one
``{"prompt": "<text>"}`` per line, the same column the hub dataset
(PrimeIntellect/Reverse-Text-RL) has.
"""

import argparse
import json
import random
from pathlib import Path

WORDS = """
apple river stone green house light water music paper garden window yellow summer winter
table chair bread honey cloud storm ocean forest silver golden orange purple little simple
quiet happy brave clever gentle bright dark early late quick slow warm cold soft hard
sweet salty fresh open close travel dream story friend family mother father sister brother
morning evening night today tomorrow yesterday city village road bridge tower castle king
queen horse tiger rabbit mouse eagle fish bird flower tree leaf grass snow rain wind fire
earth moon star planet rocket engine wheel train ship boat island beach desert mountain
valley lake coffee tea sugar salt pepper lemon cherry grape melon carrot potato tomato
butter cheese candle mirror pencil letter number circle square corner middle edge line
point voice sound color shape smile laugh dance sing write read learn teach build paint
cook clean jump run walk swim climb fly sleep wake think know find give take make keep
hold turn move stop start play work rest help blue red white black pink brown gray
""".split()


def phrases(rng: random.Random, n: int, min_words: int, max_words: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--eval", type=int, default=200)
    parser.add_argument("--min-words", type=int, default=2)
    parser.add_argument("--max-words", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "src/vf_rl/environments/reverse_text/data")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.train), ("eval", args.eval)):
        path = args.out / f"{split}.jsonl"
        with path.open("w") as f:
            for text in phrases(rng, n, args.min_words, args.max_words):
                f.write(json.dumps({"prompt": text}) + "\n")
        print(f"wrote {n} rows to {path}")


if __name__ == "__main__":
    main()
