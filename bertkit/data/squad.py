"""Reading SQuAD questions: the official v1.1/v2.0 JSON ({'data': [articles]}) or the Hugging Face datasets layout
(`squad`, `squad_v2` saved with to_json: one question per JSON line, or a JSON list of them), as `QAExample`s
(`bertkit.data.tables`), optionally a slice of the articles. A question without answers (nor is_impossible) is
skipped and counted, or kept for prediction; a file that is not SQuAD is a one-line error saying the layout."""

from __future__ import annotations

import json

from bertkit.data.tables import QAExample, ReadReport
from bertkit.data.textfiles import existing_file, read_text
from bertkit.errors import BertkitError


def parse_range(spec: str | None, n: int, what: str) -> range:
    """'A:B' (Python slice of article indices) -> range; None -> all."""
    if not spec:
        return range(n)
    try:
        a, b = spec.split(":")
        return range(n)[slice(int(a) if a else None, int(b) if b else None)]
    except ValueError:
        raise BertkitError(f"{what} {spec!r} is not START:END (e.g. 0:40)")


def read_squad(path, *, articles: str | None = None, max_examples=None,
               unanswered: bool = False) -> tuple[list[QAExample], ReadReport]:
    """Questions from a SQuAD v1.1/v2.0 JSON file, optionally a slice of its articles; a question with no
    answers (nor is_impossible) is skipped and counted, or with `unanswered` kept (prediction's input)."""
    path = existing_file(path)
    data = _squad_data(path)
    if not isinstance(data, list):
        raise BertkitError(f"{path}: not SQuAD JSON ('data' is a {type(data).__name__}, not a list of articles)")
    report = ReadReport(str(path))
    out = []
    for i in parse_range(articles, len(data), "--articles"):
        try:
            done = _squad_article(data[i], out, report, max_examples, unanswered)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BertkitError(f"{path}: article {i} is not SQuAD JSON ({type(err).__name__}: {err}); expected "
                               "{'paragraphs': [{'context', 'qas': [{'id', 'question', 'answers'}]}]}") from None
        if done:
            report.kept = len(out)
            return out, report
    report.kept = len(out)
    if not out:
        raise BertkitError(f"{path}: no questions found in articles {articles or 'all'}")
    return out, report


def _squad_data(path) -> list:
    """The articles of a SQuAD file: the official {'data': [...]} JSON, or the Hugging Face datasets layout
    (`squad`, `squad_v2` saved with to_json: one question per JSON line, or a JSON list of them), made into
    articles (`_flat_articles`)."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        lines = [line for line in text.split("\n") if line.strip()]
        try:
            data = [json.loads(line) for line in lines]
        except json.JSONDecodeError:
            raise BertkitError(f"{path}: not SQuAD JSON ({err}); expected {{'data': [{{'paragraphs': ...}}]}} "
                               "or one {'id', 'question', 'context', 'answers'} per line") from None
    if isinstance(data, dict) and "data" in data:
        return data["data"]
    if isinstance(data, list) and data and all(isinstance(r, dict) and "context" in r for r in data):
        return _flat_articles(data, path)
    raise BertkitError(f"{path}: not SQuAD JSON (no 'data' key); expected {{'data': [{{'paragraphs': ...}}]}} or "
                       "one {'id', 'question', 'context', 'answers'} per line (Hugging Face's squad layout)")


def _flat_articles(rows: list, path) -> list:
    """Hugging Face's rows ({'id', 'title', 'context', 'question', 'answers': {'text': [...], 'answer_start':
    [...]}}) as SQuAD articles, consecutive rows of one title one article; no answers is an unanswerable
    question, as transformers' run_qa.py reads squad_v2 (answer: [CLS])."""
    articles = []
    for i, r in enumerate(rows, 1):
        answers = r.get("answers", {"text": [], "answer_start": []})  # no key: unanswered (prediction's input)
        if (not isinstance(answers, dict) or not isinstance(r.get("question"), str)
                or len(answers.get("text", [])) != len(answers.get("answer_start", []))):
            raise BertkitError(f"{path}: question {i} ('id' {r.get('id')!r}) needs a 'question' and 'answers' "
                               "{'text': [...], 'answer_start': [...]} with one start per text")
        impossible = "answers" in r and not answers["text"]
        qa = {"id": str(r.get("id", i)), "question": r["question"], "is_impossible": impossible,
              "answers": [{"text": t, "answer_start": a} for t, a in zip(answers["text"], answers["answer_start"])]}
        title = r.get("title", "")
        if not articles or articles[-1]["title"] != title:
            articles.append({"title": title, "paragraphs": []})
        articles[-1]["paragraphs"].append({"context": r["context"], "qas": [qa]})
    return articles


def _squad_article(article: dict, out: list, report: ReadReport, max_examples, unanswered: bool) -> bool:
    """Append the questions of one article to `out`; True once `max_examples` are reached."""
    for para in article["paragraphs"]:
        for qa in para["qas"]:
            answers = [(a["text"], int(a["answer_start"])) for a in qa.get("answers", [])]
            impossible = bool(qa.get("is_impossible", False))
            if not answers and not impossible and not unanswered:
                report.skipped["questions without answers"] += 1
                continue
            out.append(QAExample(qa["id"], qa["question"], para["context"], answers, impossible,
                                 article.get("title", "")))
            if max_examples is not None and len(out) >= max_examples:
                return True
    return False
