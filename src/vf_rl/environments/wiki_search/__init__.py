"""wiki-search: answer a trivia question by searching and reading a small encyclopedia.

Tools (as in verifiers' ``wiki-search``): ``search_pages(query)`` lists the top pages for a
query, ``view_sections(page_id)`` lists a page's sections, ``read_section(section_id)``
returns a section's text. Search is lexical BM25 (``bm25s``) over each page's title and
text, built when the environment loads; the original ranks page titles by embedding
similarity (OpenAI embeddings in ChromaDB), which needs an API and network.

Answer format: the final answer goes inside ``<answer>...</answer>`` tags (parsed with
``XMLParser``; the last block counts). Reward ``answer_match_reward``: 1.0 when the
normalized answer (lower case, accents, punctuation, articles and extra spaces removed)
equals the reference or one of its aliases (``info["aliases"]``), or contains one of them
as a whole-word phrase while being at most ``max_extra_words`` words longer (so that
"It is Khartoum." matches "Khartoum" but dumping a whole page does not); else 0.0. The
original uses an LLM judge (gpt-4.1-mini through the OpenAI API). We do not, because
offline there is no judge to call, a judge would make rewards nondeterministic and costly,
and the questions here have short factual answers that string matching checks well.

Data: the OFFLINE corpus shipped in ``data/`` (the default): 26 short encyclopedia-style
pages and 45 questions WRITTEN FOR THIS PROJECT (``scripts/make_wiki_corpus.py``). With
``source="hub"`` (or ``"auto"`` when the hub is reachable) the original's hub datasets are
used instead: the corpus ``willcb/rare-wiki-pages`` (``id``, ``title``, ``content`` in
Markdown) and the questions ``willcb/wiki-trivia-questions-v4`` (``question``,
``answer``); the corpus and the questions always come from the same source.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset, load_dataset

from vf_rl.config.packages import require
from vf_rl.env_api import Rubric, ToolEnv, XMLParser, num_tool_calls
from vf_rl.env_api.hub import hub_or_offline

DATA_DIR = Path(__file__).parent / "data"
HUB_CORPUS = "willcb/rare-wiki-pages"
HUB_QUESTIONS = "willcb/wiki-trivia-questions-v4"
SYSTEM_PROMPT = ("Answer the question using the encyclopedia tools: search_pages finds pages, view_sections lists "
                 "the sections of a page, read_section reads one section. Give your final short answer inside "
                 "<answer></answer> tags, for example <answer>Paris</answer>.")


def normalize_text(text: str) -> str:
    """Lower case, accents folded to ASCII, punctuation and the articles a/an/the dropped,
    whitespace collapsed. ``"The Río Nile!"`` -> ``"rio nile"``; ``"8,849"`` -> ``"8849"``."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    text = re.sub(r"[^a-z0-9 ]", "", re.sub(r"[\s\-/]+", " ", text))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def answer_matches(prediction: str | None, answers: list[str], max_extra_words: int = 8) -> bool:
    """True if ``prediction`` equals one of ``answers`` after ``normalize_text``, or contains
    one as a whole-word phrase and has at most ``max_extra_words`` more words than it."""
    if not prediction:
        return False
    pred = normalize_text(prediction)
    for answer in answers:
        gold = normalize_text(answer)
        if not gold:
            continue
        if pred == gold:
            return True
        extra = len(pred.split()) - len(gold.split())
        if 0 < extra <= max_extra_words and re.search(rf"(^| ){re.escape(gold)}( |$)", pred):
            return True
    return False


def _id(text: str) -> str:
    """Section id part: ``"First ascent"`` -> ``"first_ascent"``."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_") or "section"


def _stem(words: list[str]) -> list[str]:
    """A crude plural stripper (no stemming library is installed): "rivers" -> "river"."""
    out = []
    for w in words:
        if len(w) > 4 and w.endswith("ies"):
            w = w[:-3] + "y"
        elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
            w = w[:-1]
        out.append(w)
    return out


@dataclass
class Section:
    section_id: str  # "<page_id>:<normalized section title>"
    title: str
    text: str


class WikiCorpus:
    """Pages split into sections, with a BM25 index over each page's title and text.

    Args:
        pages: dicts with ``id``, ``title`` and ``content`` (Markdown; lines starting with
            ``#`` start sections; text before the first heading is the ``introduction``).
    Raises:
        ValueError: no pages, or a page without an id or title, or a duplicate id.
    """

    def __init__(self, pages: list[dict]):
        if not pages:
            raise ValueError("wiki-search: the corpus has no pages")
        self.titles: dict[str, str] = {}
        self.sections: dict[str, list[Section]] = {}
        for page in pages:
            pid, title = str(page.get("id") or "").strip(), str(page.get("title") or "").strip()
            if not pid or not title:
                raise ValueError(f"wiki-search: page without id or title: {str(page)[:100]}")
            if pid in self.titles:
                raise ValueError(f"wiki-search: duplicate page id {pid!r}")
            self.titles[pid] = title
            self.sections[pid] = self._split(pid, page.get("content") or "")
        self.page_ids = list(self.titles)
        import bm25s  # imported here: only this environment needs it

        texts = [self.titles[p] + "\n" + "\n".join(f"{s.title}\n{s.text}" for s in self.sections[p])
                 for p in self.page_ids]
        self._bm25 = bm25s.BM25()
        self._bm25.index(self._tokenize(texts), show_progress=False)

    @staticmethod
    def _tokenize(texts, return_ids: bool = True):
        import bm25s

        texts = [unicodedata.normalize("NFKD", t).encode("ascii", "ignore").decode() for t in texts]
        return bm25s.tokenize(texts, stopwords="en", stemmer=_stem, show_progress=False, return_ids=return_ids)

    @staticmethod
    def _split(pid: str, content: str) -> list[Section]:
        sections, title, lines, seen = [], "Introduction", [], set()

        def flush():
            text = "\n".join(lines).strip()
            if text:
                sid, n = f"{pid}:{_id(title)}", 2
                while sid in seen:  # repeated headings get -2, -3...
                    sid, n = f"{pid}:{_id(title)}-{n}", n + 1
                seen.add(sid)
                sections.append(Section(sid, title, text))

        for line in content.splitlines():
            if line.startswith("#"):
                flush()
                title, lines = line.lstrip("#").strip() or "Untitled", []
            else:
                lines.append(line)
        flush()
        return sections or [Section(f"{pid}:full", "Full page", "")]

    def search(self, query: str, k: int = 5) -> list[tuple[str, str]]:
        """The top ``k`` pages for ``query`` by BM25 as ``(page_id, title)``, best first;
        pages that share no word with the query are left out (possibly all)."""
        tokens = [[t for t in self._tokenize([query], return_ids=False)[0] if t in self._bm25.vocab_dict]]
        if not tokens[0]:
            return []
        docs, scores = self._bm25.retrieve(tokens, k=min(k, len(self.page_ids)), show_progress=False)
        return [(self.page_ids[int(d)], self.titles[self.page_ids[int(d)]])
                for d, s in zip(docs[0], scores[0]) if s > 0]

    def page_sections(self, page_id: str) -> list[Section]:
        """The sections of a page. Raises ``KeyError`` (with the message) for an unknown id."""
        if page_id not in self.sections:
            raise KeyError(f"no page with id {page_id!r}; use search_pages to find page ids")
        return self.sections[page_id]

    def section(self, section_id: str) -> Section:
        """One section by id (``page_id:section``). Raises ``KeyError`` for an unknown id."""
        page_id = section_id.split(":", 1)[0]
        for s in self.page_sections(page_id):
            if s.section_id == section_id:
                return s
        raise KeyError(f"no section {section_id!r}; sections of {page_id!r}: "
                       + ", ".join(s.section_id for s in self.sections[page_id]))


def make_tools(corpus: WikiCorpus, top_k: int = 5) -> list:
    """The three tool functions over ``corpus`` (each returns text for the model; unknown
    ids raise ``KeyError``, which ``ToolEnv`` returns to the model as an error message)."""

    def search_pages(query: str) -> str:
        """Search the encyclopedia for pages about a topic.

        Returns one line per page, best match first: the page id, then the title.

        Args:
            query: a few keywords, e.g. "Nile river".
        """
        hits = corpus.search(query, top_k)
        if not hits:
            return f"No pages found for {query!r}. Try other keywords."
        return "\n".join(f"{pid}: {title}" for pid, title in hits)

    def view_sections(page_id: str) -> str:
        """List the sections of a page.

        Returns one line per section: the section id, then its title.

        Args:
            page_id: a page id from search_pages, e.g. "nile".
        """
        return "\n".join(f"{s.section_id}: {s.title}" for s in corpus.page_sections(page_id))

    def read_section(section_id: str) -> str:
        """Read the text of one section of a page.

        Args:
            section_id: a section id from view_sections, e.g. "nile:course".
        """
        s = corpus.section(section_id)
        return f"{corpus.titles[section_id.split(':', 1)[0]]} - {s.title}\n{s.text}"

    return [search_pages, view_sections, read_section]


def _read_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA_DIR / name).read_text().splitlines() if line.strip()]


def load_data(source: str = "auto", corpus_dataset: str = HUB_CORPUS, questions_dataset: str = HUB_QUESTIONS,
              split: str = "train") -> tuple[list[dict], Dataset]:
    """The corpus pages and the question rows (``question``, ``answer``, ``info`` with
    ``aliases``), both from the hub or both from the shipped offline files.

    Raises:
        ValueError: bad ``source``.
        Exception: whatever ``datasets`` raises when ``source="hub"`` and the hub fails.
    """
    def offline():
        rows = [{"question": q["question"], "answer": q["answer"], "info": {"aliases": q.get("aliases", [])},
                 "task": "wiki-search"} for q in _read_jsonl("questions.jsonl")]
        return _read_jsonl("corpus.jsonl"), Dataset.from_list(rows)

    def hub():
        pages = [dict(r) for r in load_dataset(corpus_dataset, split=split)]
        questions = load_dataset(questions_dataset, split=split).map(
            lambda x: {"question": x["question"], "answer": str(x["answer"]), "info": {"aliases": []},
                       "task": "wiki-search"})
        return pages, questions

    return hub_or_offline("wiki-search", source, hub, offline)


def load_environment(source: str = "offline", corpus_dataset: str = HUB_CORPUS,
                     questions_dataset: str = HUB_QUESTIONS, system_prompt: str | None = SYSTEM_PROMPT,
                     max_turns: int = 10, top_k: int = 5, max_extra_words: int = 8, num_train_examples: int = -1,
                     num_eval_examples: int = 10, tool_choice="auto") -> ToolEnv:
    """Build the wiki-search environment.

    Args:
        source: ``"offline"`` (default: the shipped corpus), ``"hub"`` (the original's hub
            corpus and questions) or ``"auto"`` (hub, else offline).
        corpus_dataset, questions_dataset: hub datasets used by ``"hub"``/``"auto"``.
        system_prompt: describes the tools and the ``<answer>`` format.
        max_turns: most model turns per rollout (>= 1).
        top_k: pages returned by ``search_pages`` (>= 1).
        max_extra_words: words an answer may add around the reference and still match.
        num_train_examples: first questions used for training (-1: all).
        num_eval_examples: questions for evaluation, taken from the end of the question list
            (0: none; evaluation then falls back to the training rows). They are also in the
            training rows unless ``num_train_examples`` leaves them out: every question is
            about the same fixed corpus.
        tool_choice: passed to the server; a dict such as
            ``{"type": "function", "function": {"name": "search_pages"}}`` forces a call.
    Raises:
        ValueError: bad ``source``, ``max_turns``, ``top_k``, ``max_extra_words`` or counts.
    """
    require("bm25s", "bm25s", "envs", "the wiki-search environment")
    if max_turns < 1 or top_k < 1 or max_extra_words < 0:
        raise ValueError(f"wiki-search: need max_turns >= 1, top_k >= 1 and max_extra_words >= 0, "
                         f"got {max_turns}, {top_k}, {max_extra_words}")
    if num_train_examples < -1 or num_train_examples == 0 or num_eval_examples < 0:
        raise ValueError(f"wiki-search: num_train_examples must be -1 or positive and num_eval_examples >= 0, "
                         f"got {num_train_examples}, {num_eval_examples}")
    pages, questions = load_data(source, corpus_dataset, questions_dataset)
    corpus = WikiCorpus(pages)
    train = questions.select(range(min(num_train_examples, len(questions)))) if num_train_examples > 0 else questions
    n_eval = min(num_eval_examples, len(questions))
    eval_ds = questions.select(range(len(questions) - n_eval, len(questions))) if n_eval else None
    parser = XMLParser(["answer"])

    def answer_match_reward(completion, answer, info, **kwargs) -> float:
        """1.0 if the ``<answer>`` matches the reference or an alias (see the module docstring)."""
        return 1.0 if answer_matches(parser.parse_answer(completion), [answer, *info.get("aliases", [])],
                                     max_extra_words) else 0.0

    rubric = Rubric(funcs=[answer_match_reward, num_tool_calls], weights=[1.0, 0.0], parser=parser)
    env = ToolEnv(tools=make_tools(corpus, top_k), max_turns=max_turns, tool_choice=tool_choice, dataset=train,
                  eval_dataset=eval_ds, system_prompt=system_prompt, parser=parser, rubric=rubric)
    env.corpus = corpus
    return env
