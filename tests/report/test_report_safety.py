"""A store is data, not markup: whatever its keys and labels hold, the report
escapes it and writes only inside its own folder."""
from __future__ import annotations

import io
import re
from html.parser import HTMLParser

import markupsafe
import pytest
from PIL import Image

from gradleak.report import write_report
from gradleak.store import CellRecord, ResultStore


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, format="PNG")
    return buf.getvalue()


def test_hostile_keys_and_labels_are_escaped(tmp_path):
    store_path = tmp_path / "store.db"
    hostile = "'onload='alert(1)"
    labels = {"dataset": "<script>alert(2)</script>", "model": hostile, "batch_size": 1, "local_steps": 1,
              "seed": 0, "defense": "<b>x</b>", "strength": hostile, "defenses": [], "attack": "ig",
              "attack_spec": f"ig:{hostile}", "init": None}
    with ResultStore(store_path) as store:
        for key in ("../../escaped", hostile):
            store.add_cell(CellRecord(key, "attack", "s", {}, labels, {"mse": 0.1, "psnr": 10.0}, {}, 1.0,
                                      _png()))
    out = tmp_path / "report"
    write_report(store_path, out)
    page = (out / "index.html").read_text()
    assert "<script>alert(2)" not in page and "<b>x</b>" not in page
    assert not re.search(r"<[^>]*\sonload=", page)
    assert not (tmp_path / "escaped.png").exists() and not list(tmp_path.glob("*.png"))
    assert len(list((out / "images").glob("*.png"))) == 2
    # every picture, the matrix's thumbnails included, is a hashed file of the report or a plot
    sources = re.findall(r"src='([^']*)'", page)
    assert "id='matrix'" in page and sources
    assert all(re.fullmatch(r"images/[0-9a-f]{32}\.png|tradeoff-\d+\.png|rounds\.png", s) for s in sources)


def test_large_batch_thumbnail_is_a_hashed_file(tmp_path):
    """A batch wider than the matrix shows gets its own thumbnail file, named like the grids."""
    from gradleak.store import ImageRecord

    hostile = "../<img src=x onerror=alert(1)>"
    labels = {"threat": "honest", "dataset": "mnist", "model": "lenet", "batch_size": 16, "local_steps": 1,
              "seed": 0, "defense": "none", "strength": "", "defenses": [], "attack": "ig", "attack_spec": hostile,
              "init": None}
    with ResultStore(tmp_path / "store.db") as store:
        store.add_cell(CellRecord(hostile, "attack", "s", {}, labels, {"mse": 0.1, "psnr": 10.0}, {}, 1.0, _png()),
                       [ImageRecord(i, {"mse": 0.1}, _png(), _png()) for i in range(16)])
    write_report(tmp_path / "store.db", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<img src=x" not in page
    thumbs = re.findall(r"<img class='thumb' src='(images/[0-9a-f]{32}\.png)'", page)
    assert len(thumbs) == 1 and (tmp_path / "report" / thumbs[0]).exists()
    assert len(list((tmp_path / "report" / "images").glob("*.png"))) == 2  # the grid and its thumbnail
    assert not list(tmp_path.glob("*.png"))


# Markup, an attribute break-out and template syntax in one: a label, an error or a sentence of a
# text dataset may hold any of them, and each must print as the text it is.
PAYLOAD = ("</td><script>alert(1)</script>\"><img src=x onerror=alert(1)>{{ 7*7 }}{% raw %}{{ 6*111111 }}"
           "' title='x' onmouseover='alert(1)")


def _hostile(field: str, payload: str = PAYLOAD) -> str:
    return f"{field}:{payload}"


class _Elements(HTMLParser):
    """Each element of a page as (tag, attributes, text inside), attributes and text decoded."""

    VOID = {"br", "img", "meta"}

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict, str]] = []
        self.open: list[tuple[str, dict, list[str]]] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            self.found.append((tag, dict(attrs), ""))
        else:
            self.open.append((tag, dict(attrs), []))

    def handle_endtag(self, tag):
        if tag in self.VOID or not self.open:
            return
        name, attrs, text = self.open.pop()
        assert name == tag, f"<{tag}> closes <{name}>: the page's structure broke"
        self.found.append((name, attrs, "".join(text)))
        if self.open:
            self.open[-1][2].append("".join(text))

    def handle_data(self, data):
        if self.open:
            self.open[-1][2].append(data)

    def texts(self, tag: str, css_class: str | None = None) -> list[str]:
        return [text for name, attrs, text in self.found
                if name == tag and (css_class is None or css_class in attrs.get("class", "").split())]


def _hostile_store(path, payload: str = PAYLOAD):
    """A store whose every free-text field holds the payload: labels, a skip reason, an error, the
    re-identification gallery, a client name, an initialisation, and utility runs that did not
    train (so the verdict's notes name the dataset and model)."""
    from gradleak.store import ImageRecord

    def hostile(field: str) -> str:
        return _hostile(field, payload)

    def labels(seed, **extra):
        return {"threat": hostile("threat"), "dataset": hostile("dataset"), "model": hostile("model"),
                "batch_size": 16, "local_steps": 1, "seed": seed, "defense": hostile("defense"),
                "strength": hostile("strength"), "defenses": [], "attack": "ig", "attack_spec": hostile("attack"),
                "init": None, **extra}

    ladder = {"decision": "undecided", "saturated": False, "iterations": 400, "gallery": hostile("gallery"),
              "batches": []}
    metrics = {"mse": 0.1, "psnr": 10.0, "ssim": 0.2, "examples": 16, "reid": 0.0, "reid_chance": 0.002}
    with ResultStore(path) as store:
        for seed in (0, 1):
            store.add_cell(CellRecord(f"attack{seed}", "attack", "s", {}, labels(seed), metrics, {"ladder": ladder},
                                      1.0, _png()),
                           [ImageRecord(i, {"mse": 0.1}, _png(), _png()) for i in range(16)])
        # another initialisation of the same attack: the study of initialisations names it
        store.add_cell(CellRecord("init", "attack", "s", {}, labels(0, attack_spec="ig", init=hostile("init")),
                                  metrics, {"ladder": ladder}, 1.0, _png()))
        store.add_cell(CellRecord("round", "attack", "s", {}, labels(0, round=1, client=hostile("client")), metrics,
                                  {"ladder": ladder}, 1.0, _png()))
        store.add_cell(CellRecord("skipped", "skipped", "s", {}, labels(0, reason=hostile("reason")), {}, {}, 0.0))
        store.add_cell(CellRecord("failed", "failed", "s", {}, labels(0, attack_spec="cpl", cell_kind="attack"), {},
                                  {"error": hostile("error")}, 0.0))
        for defense, strength in (("none", ""), (hostile("defense"), hostile("strength"))):
            utility = {"dataset": hostile("dataset"), "model": hostile("model"), "defense": defense,
                       "strength": strength, "seed": 0}
            store.add_cell(CellRecord(f"utility {defense}", "utility", "s", {}, utility,
                                      {"test_accuracy": 0.1, "num_classes": 10}, {}, 1.0))


# a title the length of the payload leaves the trade-off plot no room for its margins
@pytest.mark.filterwarnings("ignore:Tight layout not applied")
def test_user_text_prints_literally_wherever_it_appears(tmp_path):
    folder = tmp_path / "store '<i>{{ 7*7 }}"
    folder.mkdir()
    _hostile_store(folder / "store.db")
    write_report(folder / "store.db", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page and "<i>" not in page
    assert "666666" not in page  # template syntax is text, never evaluated

    elements = _Elements(page)
    assert not elements.open  # every element closed where the report closed it
    assert [name for name, _, _ in elements.found].count("script") == 1  # the page's own image counter
    assert not [a for _, attrs, _ in elements.found for a in attrs if a.startswith("on") or a == "title"]
    images = [attrs for name, attrs, _ in elements.found if name == "img"]
    assert all(re.fullmatch(r"images/[0-9a-f]{32}\.png|tradeoff-\d+\.png|rounds\.png", attrs["src"])
               for attrs in images)

    def shows(texts: list[str], *fields: str) -> bool:
        return all(any(_hostile(f) in t for t in texts) for f in fields)

    cells = elements.texts("td")
    assert str(folder) in elements.texts("p", "note")[0]  # the header names the store
    assert shows(elements.texts("h3"), "threat", "dataset", "model")  # the matrix's title
    assert shows(elements.texts("th"), "attack", "defense", "strength")  # matrix row and column labels
    assert shows(elements.texts("td", "empty"), "error")  # failed: ...
    assert shows(cells, "dataset", "model", "defense", "strength", "attack", "init", "client", "reason", "error")
    assert shows(elements.texts("li"), "dataset", "model", "defense", "strength")  # the verdict
    assert shows(elements.texts("p", "note"), "dataset", "model", "gallery")  # the verdict's notes
    assert shows(elements.texts("summary"), "defense")  # the gallery's groups
    assert shows(elements.texts("figcaption"), "threat", "attack", "defense", "strength")
    thumbs = [attrs["alt"] for attrs in images if attrs.get("class") == "thumb"]
    grids = [attrs["alt"] for attrs in images if "class" not in attrs and attrs["src"].startswith("images/")]
    assert shows(thumbs, "attack", "defense", "strength") and shows(grids, "threat", "attack", "defense", "strength")
    assert "{{ 7*7 }}" in page and "{% raw %}" in page  # printed as written, not as 49 or an error


def test_every_value_reaches_the_page_escaped_exactly_once(tmp_path):
    """Escaping by hand misses a spot sooner or later, and marking data as safe (or switching
    autoescaping off) lets it through: on the rendered page each free-text field of the store
    shows as its text escaped once — never raw, never escaped twice."""
    payload = "<marquee>x</marquee> &amp; &#60;u&#62; \"q\" 'a'"
    _hostile_store(tmp_path / "store.db", payload)
    write_report(tmp_path / "store.db", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<marquee>" not in page and "<u>" not in page
    for field in ("threat", "dataset", "model", "defense", "strength", "attack", "init", "client", "reason", "error",
                  "gallery"):
        assert str(markupsafe.escape(_hostile(field, payload))) in page, field
    elements = _Elements(page)
    assert not elements.open
    assert any(_hostile("dataset", payload) in text for text in elements.texts("td"))  # decoded: the text as stored


def test_hostile_sentences_print_literally_beside_their_recovery(tmp_path):
    """A text attack's sequences are the user's own sentences: a recovered sentence holding
    markup reaches the page as text, with the words it lacks marked."""
    from gradleak.store import ImageRecord

    sentence = "the cat <script>alert(1)</script> sat on {{ 7*7 }} the mat"
    recovered = "the cat <script>alert(1)</script> sat on <img src=x onerror=alert(2)> mat"
    labels = {"threat": "honest", "dataset": "news", "model": "gpt2", "batch_size": 2, "local_steps": 1,
              "seed": 0, "defense": "none", "strength": "", "defenses": [], "attack": "tag", "attack_spec": "tag",
              "init": None}
    sequences = [{"index": 0, "original": sentence, "recovered": recovered, "exact": False},
                 {"index": 1, "original": sentence, "recovered": sentence, "exact": True}]
    metrics = {"rouge1": 0.8, "rouge2": 0.6, "asr": 0.5, "examples": 2, "reid": 1.0, "reid_chance": 0.001}
    with ResultStore(tmp_path / "store.db") as store:
        store.add_cell(CellRecord("text", "attack", "s", {}, labels, metrics,
                                  {"ladder": {"decision": "leak"}, "sequences": sequences}, 1.0, None),
                       [ImageRecord(i, {"rouge1": 0.8}, None, None) for i in range(2)])
    result = write_report(tmp_path / "store.db", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    # the page names its store, whose temporary path may hold any digits (pytest-149)
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "49" not in page.replace(str(tmp_path), "")  # {{ 7*7 }} is not evaluated
    elements = _Elements(page)
    assert not elements.open
    rows = elements.texts("td", "l")
    assert any("<script>alert(1)</script>" in r and "{{" in r for r in rows)  # the sentence, as text
    # the original's "the" and "{{ 7*7 }}" are missing from the recovery, which adds the <img ...> words
    assert "{{" in elements.texts("mark") and "src=x" in elements.texts("mark")
    assert "(exact)" in page and result["texts"] == 1 and result["grids"] == 0
    assert "ROUGE-1 0.8" in page
