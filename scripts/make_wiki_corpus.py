"""Write the offline corpus and questions shipped with the wiki-search environment.

Source: the pages and questions below were WRITTEN FOR THIS PROJECT and are released with it
(Apache-2.0, like the rest of vf-rl). They are short encyclopedia-style summaries of common
science and geography facts, in our own words; no text is copied from Wikipedia or any other
source. The format follows the hub corpus the original environment used
(``willcb/rare-wiki-pages``: ``id``, ``title``, ``content`` in Markdown with ``#`` section
headings) and its question set (``question``, ``answer``):

    python scripts/make_wiki_corpus.py

writes ``src/vf_rl/environments/wiki_search/data/corpus.jsonl`` (one page per line) and
``questions.jsonl`` (one ``{"question", "answer", "aliases", "page_id"}`` per line; every
answer appears in the text of page ``page_id``, which the script checks).
"""

from __future__ import annotations

import argparse
import json
import re
import unicodedata
from pathlib import Path

# (title, introduction, [(section title, text), ...])
PAGES = [
    ("Mount Everest", "Mount Everest is the highest mountain on Earth above sea level.", [
        ("Location", "Mount Everest lies in the Mahalangur range of the Himalayas. The border between Nepal and "
                     "the Tibet region of China runs across its summit."),
        ("Height", "A survey completed in 2020 measured the summit at 8,849 metres above sea level."),
        ("First ascent", "Edmund Hillary of New Zealand and Tenzing Norgay, a Sherpa climber from Nepal, were the "
                         "first people confirmed to reach the summit, on 29 May 1953."),
    ]),
    ("Nile", "The Nile is a major river of northeastern Africa and one of the longest rivers in the world.", [
        ("Course", "The Nile is about 6,650 kilometres long. It flows north through Sudan and Egypt and empties "
                   "into the Mediterranean Sea through a wide delta."),
        ("Tributaries", "Its two main branches are the White Nile and the Blue Nile, which meet at Khartoum, the "
                        "capital of Sudan. The Blue Nile begins at Lake Tana in Ethiopia and carries most of the "
                        "water and silt during the summer floods."),
    ]),
    ("Amazon River", "The Amazon is the river with the greatest flow of water in the world.", [
        ("Course", "The Amazon rises in the Andes mountains of Peru and crosses Brazil before it empties into the "
                   "Atlantic Ocean."),
        ("Discharge", "The river carries more water than the next several largest rivers combined, roughly a fifth "
                      "of all the fresh water that rivers deliver to the oceans."),
        ("Rainforest", "The Amazon basin holds the largest tropical rainforest on Earth, home to a vast number of "
                       "plant and animal species."),
    ]),
    ("Sahara", "The Sahara is the largest hot desert in the world.", [
        ("Geography", "The Sahara covers most of northern Africa, about 9 million square kilometres, from the "
                      "Atlantic Ocean in the west to the Red Sea in the east."),
        ("Climate", "Rain is rare in most of the Sahara. Days can be extremely hot, while nights in the open desert "
                    "can be cold because dry air and clear skies let heat escape."),
    ]),
    ("Pacific Ocean", "The Pacific Ocean is the largest and deepest of Earth's oceans.", [
        ("Size", "The Pacific covers about a third of the surface of the Earth, more than all the land area "
                 "combined."),
        ("Mariana Trench", "The deepest known point of any ocean, the Challenger Deep, lies in the Mariana Trench in "
                           "the western Pacific, nearly 11,000 metres below the surface."),
        ("Name", "The explorer Ferdinand Magellan named the ocean 'Mar Pacifico', the peaceful sea, because its "
                 "waters were calm when his ships entered it in 1520."),
    ]),
    ("Photosynthesis", "Photosynthesis is the process by which plants, algae and some bacteria make food from "
                       "light.", [
        ("Process", "Using the energy of sunlight, plants turn water and carbon dioxide into glucose, a sugar. "
                    "Oxygen is released as a by-product."),
        ("Chlorophyll", "The light is absorbed by chlorophyll, a green pigment found in chloroplasts. Chlorophyll "
                        "reflects green light, which is why leaves look green."),
    ]),
    ("Water cycle", "The water cycle describes how water moves between the oceans, the air and the land.", [
        ("Evaporation", "Heat from the Sun turns water from oceans, lakes and rivers into water vapour. Plants also "
                        "release vapour from their leaves, a process called transpiration."),
        ("Condensation", "As moist air rises it cools, and the vapour condenses into tiny droplets that form "
                         "clouds."),
        ("Precipitation", "When the droplets grow heavy enough they fall as rain, snow or hail, and the water flows "
                          "back to the sea through rivers and ground water."),
    ]),
    ("Solar System", "The Solar System is the Sun and everything that orbits it.", [
        ("Planets", "There are eight planets. Mercury is the closest to the Sun and Neptune the farthest. Jupiter is "
                    "the largest planet, more than twice as massive as all the others combined."),
        ("Sun", "The Sun is a star made mostly of hydrogen and helium. Its average distance from Earth, about 150 "
                "million kilometres, is called one astronomical unit."),
    ]),
    ("Mars", "Mars is the fourth planet from the Sun, often called the Red Planet.", [
        ("Surface", "Mars looks red because its dust and rocks contain iron oxide, or rust. It has Olympus Mons, the "
                    "largest volcano known in the Solar System."),
        ("Moons", "Mars has two small moons, Phobos and Deimos. Phobos is the larger and orbits closer to the "
                  "planet."),
    ]),
    ("Moon", "The Moon is Earth's only natural satellite.", [
        ("Orbit", "The Moon orbits Earth at an average distance of about 384,400 kilometres and completes one orbit "
                  "in about 27.3 days. The same side always faces Earth."),
        ("Exploration", "The Apollo 11 mission landed the first people on the Moon in July 1969. Neil Armstrong was "
                        "the first person to walk on its surface, followed by Buzz Aldrin."),
    ]),
    ("Human heart", "The human heart is a muscular organ that pumps blood through the body.", [
        ("Structure", "The heart has four chambers: two upper chambers called atria and two lower chambers called "
                      "ventricles. Valves keep the blood flowing in one direction."),
        ("Function", "The right side pumps blood to the lungs to pick up oxygen, and the left side pumps it to the "
                     "rest of the body. At rest an adult heart usually beats 60 to 100 times a minute."),
    ]),
    ("DNA", "DNA, deoxyribonucleic acid, is the molecule that carries genetic instructions in living things.", [
        ("Structure", "DNA is shaped like a twisted ladder, a double helix. James Watson and Francis Crick "
                      "described this structure in 1953, using X-ray images made by Rosalind Franklin."),
        ("Bases", "The rungs of the ladder are pairs of four bases: adenine pairs with thymine, and guanine pairs "
                  "with cytosine."),
    ]),
    ("Water", "Water is a chemical compound of hydrogen and oxygen, with the formula H2O.", [
        ("Properties", "At sea level pure water freezes at 0 degrees Celsius and boils at 100 degrees Celsius."),
        ("Ice", "Unlike most substances, water expands when it freezes, so ice is less dense than liquid water and "
                "floats. This keeps lakes from freezing solid from the bottom up."),
    ]),
    ("Iron", "Iron is a metallic chemical element and the most common element on Earth by mass.", [
        ("Properties", "Iron has the chemical symbol Fe, from the Latin word ferrum, and atomic number 26. It rusts "
                       "in moist air, forming iron oxide."),
        ("Uses", "Most iron is made into steel, an alloy of iron with a small amount of carbon that is stronger "
                 "than pure iron."),
    ]),
    ("Gold", "Gold is a dense, soft, yellow metal prized since ancient times.", [
        ("Properties", "Gold has the chemical symbol Au, from the Latin aurum, and atomic number 79. It does not "
                       "rust or tarnish."),
        ("Uses", "Gold is used in jewellery, in coins and as a store of value, and in electronics because it "
                 "conducts electricity well and resists corrosion."),
    ]),
    ("Oxygen", "Oxygen is a chemical element that most living things need to survive.", [
        ("Properties", "Oxygen has the chemical symbol O and atomic number 8. At room temperature it is a "
                       "colourless gas."),
        ("Atmosphere", "Oxygen makes up about 21 percent of Earth's atmosphere; most of the rest is nitrogen. Almost "
                       "all of it was produced by photosynthesis."),
    ]),
    ("Great Barrier Reef", "The Great Barrier Reef is the largest coral reef system in the world.", [
        ("Location", "The reef stretches for about 2,300 kilometres off the coast of Queensland, in northeastern "
                     "Australia."),
        ("Ecology", "The reef is built by billions of tiny animals called coral polyps. Warmer seas cause coral "
                    "bleaching, a major threat to the reef."),
    ]),
    ("Lake Baikal", "Lake Baikal is a rift lake in Siberia, Russia.", [
        ("Records", "Lake Baikal is the deepest lake in the world, at about 1,642 metres, and one of the oldest, at "
                    "about 25 million years. It holds about a fifth of the world's unfrozen fresh surface water."),
        ("Wildlife", "Many of its species live nowhere else, including the Baikal seal, or nerpa, one of the few "
                     "seals that live only in fresh water."),
    ]),
    ("Iceland", "Iceland is an island country in the North Atlantic Ocean.", [
        ("Geography", "Iceland lies on the Mid-Atlantic Ridge, where two tectonic plates pull apart, so it has many "
                      "volcanoes and hot springs. Its capital and largest city is Reykjavik."),
        ("Energy", "Almost all of Iceland's electricity comes from hydropower and geothermal power, and geothermal "
                   "water heats about nine out of ten homes."),
    ]),
    ("Honey bee", "Honey bees are social insects that live in large colonies and make honey.", [
        ("Colony", "A colony has one queen, which lays the eggs, thousands of female workers, and male bees called "
                   "drones."),
        ("Communication", "A worker that finds food tells the others where it is with the waggle dance, a movement "
                          "whose direction and length show the direction and distance of the flowers."),
    ]),
    ("Blue whale", "The blue whale is a marine mammal and the largest animal known to have ever lived.", [
        ("Size", "Blue whales can grow to about 30 metres long and weigh well over 100 tonnes."),
        ("Diet", "Despite their size, blue whales feed almost only on krill, small shrimp-like animals, which they "
                 "filter from the water with baleen plates."),
    ]),
    ("Volcano", "A volcano is an opening in Earth's crust through which molten rock, ash and gases escape.", [
        ("Formation", "Most volcanoes form where tectonic plates pull apart or push together, but some, such as "
                      "those of Hawaii, grow over hot spots in the middle of a plate."),
        ("Types", "Shield volcanoes, such as Mauna Loa in Hawaii, have gentle slopes built by runny lava. "
                  "Stratovolcanoes, such as Mount Fuji in Japan, are steep cones of layered lava and ash."),
    ]),
    ("Speed of light", "The speed of light in a vacuum is a universal physical constant.", [
        ("Value", "Light travels at exactly 299,792,458 metres per second in a vacuum, or about 299,792 kilometres "
                  "per second."),
        ("Light-year", "A light-year is the distance light travels in one year, about 9.46 trillion kilometres. It "
                       "is used to measure distances between stars."),
    ]),
    ("Penguin", "Penguins are flightless seabirds that swim with flipper-like wings.", [
        ("Habitat", "Almost all penguins live in the Southern Hemisphere. The Galapagos penguin lives near the "
                    "equator, the farthest north of any penguin."),
        ("Emperor penguin", "The emperor penguin is the largest species of penguin. It breeds on the sea ice of "
                            "Antarctica during the winter, and the male keeps the egg warm on its feet."),
    ]),
    ("Tide", "Tides are the regular rise and fall of the sea level.", [
        ("Cause", "Tides are caused mainly by the gravity of the Moon, and to a lesser degree the Sun, pulling on "
                  "the oceans as Earth rotates. Most coasts see two high tides a day."),
        ("Spring and neap tides", "When the Sun, the Moon and Earth line up, at new and full moon, the tidal range is "
                                  "largest: these are spring tides. At the quarter moons the range is smallest: these "
                                  "are neap tides."),
    ]),
    ("Danube", "The Danube is the second-longest river in Europe, after the Volga.", [
        ("Course", "The Danube rises in the Black Forest in Germany and flows about 2,850 kilometres to the Black "
                   "Sea."),
        ("Capitals", "It flows through four capital cities: Vienna, Bratislava, Budapest and Belgrade."),
    ]),
]

# (question, answer, aliases, page title)
QUESTIONS = [
    ("Who reached the summit of Mount Everest together with Edmund Hillary in 1953?", "Tenzing Norgay", [],
     "Mount Everest"),
    ("How many metres above sea level is the summit of Mount Everest, according to the 2020 survey?", "8,849", [],
     "Mount Everest"),
    ("In which mountain range is Mount Everest?", "Himalayas", ["Himalaya", "Mahalangur"], "Mount Everest"),
    ("In which city do the White Nile and the Blue Nile meet?", "Khartoum", [], "Nile"),
    ("From which lake does the Blue Nile begin?", "Lake Tana", [], "Nile"),
    ("Into which sea does the Nile empty?", "Mediterranean Sea", ["Mediterranean"], "Nile"),
    ("Into which ocean does the Amazon River empty?", "Atlantic Ocean", ["Atlantic"], "Amazon River"),
    ("In which country does the Amazon River rise?", "Peru", [], "Amazon River"),
    ("What is the deepest known point of any ocean called?", "Challenger Deep", [], "Pacific Ocean"),
    ("Which explorer named the Pacific Ocean?", "Ferdinand Magellan", ["Magellan"], "Pacific Ocean"),
    ("What green pigment absorbs light for photosynthesis?", "chlorophyll", [], "Photosynthesis"),
    ("What sugar do plants make during photosynthesis?", "glucose", [], "Photosynthesis"),
    ("What is the release of water vapour from plant leaves called?", "transpiration", [], "Water cycle"),
    ("Which planet is closest to the Sun?", "Mercury", [], "Solar System"),
    ("Which is the largest planet in the Solar System?", "Jupiter", [], "Solar System"),
    ("What substance makes the surface of Mars look red?", "iron oxide", ["rust"], "Mars"),
    ("What is the name of the larger moon of Mars?", "Phobos", [], "Mars"),
    ("What is the largest known volcano in the Solar System?", "Olympus Mons", [], "Mars"),
    ("Which mission first landed people on the Moon?", "Apollo 11", [], "Moon"),
    ("Who was the first person to walk on the Moon?", "Neil Armstrong", ["Armstrong"], "Moon"),
    ("How many chambers does the human heart have?", "four", ["4"], "Human heart"),
    ("What are the two lower chambers of the heart called?", "ventricles", [], "Human heart"),
    ("Who described the double helix structure of DNA together with James Watson?", "Francis Crick", ["Crick"],
     "DNA"),
    ("Which DNA base pairs with adenine?", "thymine", [], "DNA"),
    ("At how many degrees Celsius does pure water boil at sea level?", "100", [], "Water"),
    ("What is the chemical symbol of iron?", "Fe", [], "Iron"),
    ("What is the atomic number of gold?", "79", [], "Gold"),
    ("About what percentage of Earth's atmosphere is oxygen?", "21", ["21 percent", "21%"], "Oxygen"),
    ("Off the coast of which Australian state is the Great Barrier Reef?", "Queensland", [], "Great Barrier Reef"),
    ("Which tiny animals build coral reefs?", "coral polyps", ["polyps"], "Great Barrier Reef"),
    ("What is the deepest lake in the world?", "Lake Baikal", ["Baikal"], "Lake Baikal"),
    ("What is the seal that lives in Lake Baikal also called?", "nerpa", ["Baikal seal"], "Lake Baikal"),
    ("What is the capital of Iceland?", "Reykjavik", [], "Iceland"),
    ("On which mid-ocean ridge does Iceland lie?", "Mid-Atlantic Ridge", [], "Iceland"),
    ("What are male honey bees called?", "drones", ["drone"], "Honey bee"),
    ("What dance do honey bee workers use to show where food is?", "waggle dance", [], "Honey bee"),
    ("What do blue whales mainly eat?", "krill", [], "Blue whale"),
    ("Which volcano in Hawaii is an example of a shield volcano?", "Mauna Loa", [], "Volcano"),
    ("Which Japanese mountain is a stratovolcano?", "Mount Fuji", ["Fuji"], "Volcano"),
    ("About how many kilometres does light travel in one second?", "299,792", ["300,000"], "Speed of light"),
    ("Which is the largest species of penguin?", "emperor penguin", ["emperor"], "Penguin"),
    ("Which penguin lives near the equator?", "Galapagos penguin", ["Galapagos"], "Penguin"),
    ("What are the tides with the largest range called?", "spring tides", ["spring tide"], "Tide"),
    ("Into which sea does the Danube flow?", "Black Sea", [], "Danube"),
    ("Which European river is longer than the Danube?", "Volga", [], "Danube"),
]


def page_id(title: str) -> str:
    """``"Mount Everest"`` -> ``"mount_everest"``."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return " ".join(re.sub(r"[^a-z0-9 ]", "", text).split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "src/vf_rl/environments/wiki_search/data")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pages = {}
    for title, intro, sections in PAGES:
        content = intro + "\n\n" + "\n\n".join(f"# {name}\n{text}" for name, text in sections)
        pages[title] = {"id": page_id(title), "title": title, "content": content}
    questions = []
    for question, answer, aliases, title in QUESTIONS:
        if normalize(answer) not in normalize(pages[title]["content"]):
            raise SystemExit(f"answer {answer!r} is not in page {title!r}")
        questions.append({"question": question, "answer": answer, "aliases": aliases, "page_id": page_id(title)})
    for name, rows in (("corpus", pages.values()), ("questions", questions)):
        path = args.out / f"{name}.jsonl"
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
