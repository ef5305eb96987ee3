"""Rules for the task roles: server-only tasks, augmentation, scoring (ASTRA §2.1.3).

- ``task_from_server``: templates over the server's tool docs, one to three
  tools per task, the anchor tool rotating with ``variant`` for coverage. Like
  a real generator it also writes some weak drafts (vague requests without
  concrete values, general-knowledge questions); the scorer has to catch them.
- ``augment_task``: diversity (reframing, verb paraphrases, context,
  preferences), complexity (an extra constraint drawn from the tools' optional
  arguments, a follow-up need drawn from their outputs), persona (novice,
  expert, concise, verbose, hurried, polite). Templates exist for English,
  Spanish, French and German; other languages get language-neutral rewrites
  (list layout, ``key=value`` constraints). The original text is kept whole
  (only whole words outside quotes are paraphrased), so every value stays.
- ``score_task``: the three scores computed from the text and the tool docs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.records.sft import ServerRef
from arena.records.tools import NormalizedTool
from simulator.chains import acts_on_deleted, can_follow, nonsense_problem, user_can_start
from simulator.task_writer import compose_task, plan_steps, slots_of
from simulator.text import DOC_STOPWORDS, VERBS, capitalise, humanize, name_words, text_stems, tool_terms
from simulator.values import ValueBook, enum_values, kind_of, render
from synthesis.envs.text import fold
from synthesis.sft.lang import count_words, detect_language
from synthesis.sft.roles.chains import TaskDraft
from synthesis.sft.roles.tasks import (
    AUGMENT_TASK,
    SCORE_TASK,
    TASK_FROM_SERVER,
    AugmentedTask,
    AugmentInput,
    ServerTaskInput,
    TaskScoreInput,
    TaskScores,
)
from synthesis.sft.tool_links import Argument, arguments, output_fields, required_arguments, singular, snake

WEAK_RATE = 0.25
"""Share of server-only drafts that come out weak (vague or general knowledge)."""
SERVER_OPENERS = ("I'd like you to", "Could you", "Would you", "Please", "I want to", "Can you")

# ============================================================================ server-only tasks


def _topic(tool: NormalizedTool) -> str:
    """What a tool is about, from its name: ``get_stock_quote`` -> ``stock quote``."""
    words = name_words(tool.function.name)
    if words and words[0] in VERBS:
        words = words[1:]
    return " ".join(words) or tool.function.name


def weak_task(anchor: NormalizedTool, rng: random.Random) -> TaskDraft:
    """A draft without concrete values: vague, or answerable from general knowledge."""
    topic = _topic(anchor)
    templates = (
        "Can you help me with {t}?",
        "I have a question about {t}.",
        "Could you look into {t} for me?",
        "What is a {s}, in general?",
        "Explain how {t} usually works.",
        "Tell me something interesting about {t}.",
    )
    text = rng.choice(templates).format(t=topic, s=singular(topic))
    return TaskDraft(text=text, slots=[])


def server_tools(server: ServerRef, anchor: NormalizedTool, rng: random.Random) -> list[NormalizedTool]:
    """The anchor, reached from a tool that yields its identifiers when a user could not state
    them, then up to two more tools: steps consuming earlier outputs, or one independent need."""
    tools = sorted(server.tools, key=lambda t: t.function.name)
    chosen = [anchor]
    if not user_can_start(anchor):
        feeders = [
            t
            for t in tools
            if t is not anchor
            and user_can_start(t)
            and can_follow([t], anchor)
            and not acts_on_deleted([t, anchor])
        ]
        if feeders:
            chosen = [rng.choice(feeders), anchor]
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        followers = [
            t
            for t in tools
            if t not in chosen and can_follow(chosen, t) and not acts_on_deleted([*chosen, t])
        ]
        independent = [t for t in tools if t not in chosen and user_can_start(t) and required_arguments(t)]
        if followers and (rng.random() < 0.7 or not independent):
            chosen.append(rng.choice(followers))
        elif independent:  # a separate need comes last, after the connected steps
            chosen.append(rng.choice(independent))
            break
    return chosen


def anchor_tool(server: ServerRef, variant: int) -> NormalizedTool:
    """The tool variant ``variant`` is built around: consecutive variants rotate through every
    tool in a server-specific order (coverage), independent of the call's rng."""
    order = sorted(server.tools, key=lambda t: t.function.name)
    random.Random(f"{server.server_id}/server-tasks").shuffle(order)
    return order[variant % len(order)]


def task_from_server(inputs: BaseModel, rng: random.Random) -> TaskDraft:
    assert isinstance(inputs, ServerTaskInput)
    server = inputs.server
    if not server.tools:
        raise Undecidable("the server has no tools to write a task for")
    anchor = anchor_tool(server, inputs.variant)
    if rng.random() < WEAK_RATE:
        return weak_task(anchor, rng)
    tools = server_tools(server, anchor, rng)
    steps = plan_steps(tools, ValueBook(rng))
    text = compose_task(server, tools, steps, rng, inputs.variant + 1, SERVER_OPENERS)
    return TaskDraft(text=text, slots=slots_of(steps))


# ================================================================================ augmentation


@dataclass(frozen=True)
class Templates:
    """Augmentation templates of one language; ``{task}``, ``{c}`` and ``{f}`` are filled in."""

    contexts: tuple[str, ...]
    preferences: tuple[str, ...]
    reframes: tuple[str, ...]
    synonyms: tuple[tuple[str, str], ...]
    constraints: tuple[str, ...]
    followups: tuple[str, ...]
    followups_fields: tuple[str, ...]
    personas: tuple[tuple[str, str], ...]
    fillers: tuple[str, ...]
    brief: str


TEMPLATES: dict[str, Templates] = {
    "en": Templates(
        contexts=(
            "I'm sorting this out for my family.",
            "This is for a project at work.",
            "I've been putting this off for a while.",
        ),
        preferences=(
            "If there are several options, I'd prefer the simplest one.",
            "Please keep the answer short and list the key numbers.",
            "I'd rather get exact figures than estimates.",
        ),
        reframes=("Here is what I need: {task}", "{task} Thanks!", "Hi, quick request. {task}"),
        synonyms=(
            ("search", "look up"),
            ("get", "fetch"),
            ("list", "show me"),
            ("create", "make"),
            ("read", "open"),
            ("check", "see"),
            ("retrieve", "pull up"),
            ("compute", "work out"),
            ("calculate", "work out"),
        ),
        constraints=("Also, make sure the {c}.", "One more condition: the {c}.", "Please make sure the {c}."),
        followups=("Afterwards, give me a short summary of the results.",),
        followups_fields=(
            "Afterwards, summarise the {f} in a short list.",
            "Once that's done, tell me the {f} so I can note them down.",
        ),
        personas=(
            (
                "novice",
                "Hi! I'm new to this and not very technical. {task} Could you explain what you find in simple terms?",
            ),
            ("expert", "{task} Skip the explanations; I only need the exact values returned."),
            ("concise", "{task}"),
            (
                "verbose",
                "Hello, I hope you're well. I've been meaning to deal with this for some time and would really appreciate your help. {task} Thank you so much in advance for taking care of this.",
            ),
            ("hurried", "Quick one, I'm in a rush: {task}"),
            (
                "polite",
                "Good morning! Would you be so kind as to help me with something? {task} Many thanks.",
            ),
        ),
        fillers=("Please help me with this. ", "Here's what I need. ", "I need some help. ", "Please "),
        brief="Short answer, please.",
    ),
    "es": Templates(
        contexts=("Lo estoy organizando para mi familia.", "Es para un proyecto del trabajo."),
        preferences=(
            "Si hay varias opciones, prefiero la más sencilla.",
            "Por favor, responde de forma breve con los datos clave.",
        ),
        reframes=("Esto es lo que necesito: {task}", "{task} ¡Gracias!", "Hola, una petición rápida. {task}"),
        synonyms=(("busca", "encuentra"), ("quiero", "me gustaría"), ("necesito", "me hace falta")),
        constraints=("Además, ten en cuenta esta condición: {c}.", "Una condición más: {c}."),
        followups=("Después, resume los resultados más importantes en una lista corta.",),
        followups_fields=("Después, resume los resultados más importantes en una lista corta.",),
        personas=(
            (
                "novice",
                "¡Hola! Soy nuevo en esto y no sé mucho de tecnología. {task} ¿Me lo puedes explicar de forma sencilla?",
            ),
            ("expert", "{task} Sin explicaciones, por favor; solo necesito los valores exactos."),
            ("concise", "{task}"),
            (
                "verbose",
                "Hola, espero que estés bien. Llevo tiempo queriendo resolver esto y te agradecería mucho la ayuda. {task} Muchísimas gracias de antemano.",
            ),
            ("hurried", "Rápido, que tengo prisa: {task}"),
            ("polite", "¡Buenos días! ¿Serías tan amable de ayudarme con algo? {task} Muchas gracias."),
        ),
        fillers=("Por favor, ayúdame con esto. ", "Por favor, "),
        brief="Respuesta breve, por favor.",
    ),
    "fr": Templates(
        contexts=("Je m'en occupe pour ma famille.", "C'est pour un projet au travail."),
        preferences=(
            "S'il y a plusieurs options, je préfère la plus simple.",
            "Merci de répondre brièvement avec les chiffres clés.",
        ),
        reframes=(
            "Voici ce dont j'ai besoin : {task}",
            "{task} Merci !",
            "Bonjour, une demande rapide. {task}",
        ),
        synonyms=(("trouve", "cherche"), ("je veux", "j'aimerais"), ("donne-moi", "indique-moi")),
        constraints=("De plus, tiens compte de cette condition : {c}.", "Une condition de plus : {c}."),
        followups=("Ensuite, résume les résultats principaux dans une courte liste.",),
        followups_fields=("Ensuite, résume les résultats principaux dans une courte liste.",),
        personas=(
            (
                "novice",
                "Bonjour ! Je débute et je ne suis pas très à l'aise avec la technique. {task} Peux-tu m'expliquer le résultat simplement ?",
            ),
            ("expert", "{task} Pas d'explications, s'il te plaît ; seulement les valeurs exactes."),
            ("concise", "{task}"),
            (
                "verbose",
                "Bonjour, j'espère que tu vas bien. Cela fait un moment que je veux régler cela et ton aide me serait précieuse. {task} Merci infiniment d'avance.",
            ),
            ("hurried", "Vite, je suis pressé : {task}"),
            ("polite", "Bonjour ! Aurais-tu l'amabilité de m'aider ? {task} Merci beaucoup."),
        ),
        fillers=("Merci de m'aider avec ceci. ", "S'il te plaît, "),
        brief="Réponse courte, s'il te plaît.",
    ),
    "de": Templates(
        contexts=("Ich kümmere mich darum für meine Familie.", "Das ist für ein Projekt bei der Arbeit."),
        preferences=(
            "Wenn es mehrere Möglichkeiten gibt, nehme ich lieber die einfachste.",
            "Bitte antworte kurz und nenne die wichtigsten Zahlen.",
        ),
        reframes=("Das brauche ich: {task}", "{task} Danke!", "Hallo, eine kurze Bitte. {task}"),
        synonyms=(("suche", "finde"), ("ich möchte", "ich würde gern"), ("zeig mir", "nenne mir")),
        constraints=("Außerdem gilt diese Bedingung: {c}.", "Noch eine Bedingung: {c}."),
        followups=("Fasse danach die wichtigsten Ergebnisse in einer kurzen Liste zusammen.",),
        followups_fields=("Fasse danach die wichtigsten Ergebnisse in einer kurzen Liste zusammen.",),
        personas=(
            (
                "novice",
                "Hallo! Ich bin neu hier und kenne mich technisch nicht gut aus. {task} Kannst du mir das Ergebnis einfach erklären?",
            ),
            ("expert", "{task} Bitte keine Erklärungen; ich brauche nur die genauen Werte."),
            ("concise", "{task}"),
            (
                "verbose",
                "Hallo, ich hoffe, es geht dir gut. Ich wollte das schon lange erledigen und wäre dir für deine Hilfe sehr dankbar. {task} Vielen herzlichen Dank im Voraus.",
            ),
            ("hurried", "Schnell, ich habe es eilig: {task}"),
            ("polite", "Guten Morgen! Wärst du so freundlich, mir zu helfen? {task} Vielen Dank."),
        ),
        fillers=("Bitte hilf mir dabei. ", "Bitte "),
        brief="Kurze Antwort, bitte.",
    ),
}

_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|«[^»]*»|(?<!\w)'[^'\n]+'(?!\w)")


def _spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _QUOTED.finditer(text)]


def paraphrase(text: str, synonyms: Sequence[tuple[str, str]], rng: random.Random) -> str:
    """Swap up to two whole words/phrases for synonyms, never inside quotes or next to / . @ - or digits."""
    pairs = list(synonyms)
    rng.shuffle(pairs)
    swaps = 0
    for word, other in pairs:
        protected = _spans(text)
        pattern = re.compile(rf"(?<![\w/.@-]){re.escape(word)}(?![\w/.@-])", re.IGNORECASE)
        hit = next(
            (m for m in pattern.finditer(text) if not any(a <= m.start() < b for a, b in protected)), None
        )
        if hit is None:
            continue
        replacement = other if hit.group(0)[0].islower() else capitalise(other)
        text = text[: hit.start()] + replacement + text[hit.end() :]
        swaps += 1
        if swaps == 2:
            break
    return text


def relevant_tools(task: str, tools: Sequence[NormalizedTool]) -> list[NormalizedTool]:
    """Tools the task is about (shared name/description stems), best first."""
    stems = text_stems(task)
    scored = sorted(
        ((len(tool_terms(t) & stems), t.function.name, t) for t in tools), key=lambda x: (-x[0], x[1])
    )
    return [t for n, _, t in scored if n > 0]


def constraint(task: str, tools: Sequence[NormalizedTool], rng: random.Random) -> tuple[str, str] | None:
    """An extra requirement from an optional argument the task leaves open: (human, key=value)."""
    folded = fold(task)
    options: list[tuple[Argument, NormalizedTool]] = []
    for tool in relevant_tools(task, tools) or list(tools):
        for arg in arguments(tool):
            label = humanize(arg.name)
            if arg.required or fold(label) in folded or snake(arg.name) in folded:
                continue
            if kind_of(arg) in ("enum", "limit", "money", "people", "days", "quantity", "boolean"):
                options.append((arg, tool))
    if not options:
        return None
    arg, tool = rng.choice(options)
    value = ValueBook(rng).value(arg, tool)
    human = _constraint_phrase(arg, value)
    return human, f"{snake(arg.name)}={value}"


def _constraint_phrase(arg: Argument, value: str) -> str:
    label, kind = humanize(arg.name), kind_of(arg)
    if kind == "money" and ("max" in label or "price" in label):
        return f"{label.replace('max ', '')} stays at or below {value}"
    if kind == "limit":
        return f"results are limited to {value}"
    if kind == "boolean":
        return f"{label} option is {'on' if value == 'yes' else 'off'}"
    verb = "are" if label.endswith("s") and not label.endswith("ss") else "is"
    return f"{label} {verb} {value}"


def followup_fields(task: str, tools: Sequence[NormalizedTool]) -> list[str]:
    """Two output fields of the most relevant tool, humanised, for a follow-up need."""
    for tool in relevant_tools(task, tools)[:1]:
        names = [humanize(f.name) for f in output_fields(tool) if "." not in f.path]
        names = [n for n in names if n not in ("items", "id")][:2]
        if names:
            return names
    return []


def augment_diversity(task: str, tpl: Templates, rng: random.Random) -> str:
    text = paraphrase(task, tpl.synonyms, rng)
    move = rng.randrange(3)
    if move == 0:
        return f"{rng.choice(tpl.contexts)} {text}"
    if move == 1:
        return f"{text} {rng.choice(tpl.preferences)}"
    return rng.choice(tpl.reframes).format(task=text)


def augment_complexity(
    task: str, tpl: Templates, tools: Sequence[NormalizedTool], lang: str, rng: random.Random
) -> str:
    extra: list[str] = []
    found = constraint(task, tools, rng)
    if found is not None:
        extra.append(rng.choice(tpl.constraints).format(c=found[0] if lang == "en" else found[1]))
    fields = followup_fields(task, tools) if lang == "en" else []
    if fields:
        extra.append(rng.choice(tpl.followups_fields).format(f=" and ".join(fields)))
    elif not extra or rng.random() < 0.5:
        extra.append(rng.choice(tpl.followups))
    return " ".join([task, *extra])


def augment_persona(task: str, tpl: Templates, variant: int, rng: random.Random) -> tuple[str, str]:
    persona, template = tpl.personas[(variant + rng.randrange(len(tpl.personas))) % len(tpl.personas)]
    if persona == "concise":  # drop courtesy sentences and a leading "Please" (never inside quotes)
        text = task
        for filler in tpl.fillers:
            at = text.find(filler)
            if (
                at >= 0
                and not any(a <= at < b for a, b in _spans(text))
                and (at == 0 or text[at - 2 : at] == ". ")
            ):
                text = text[:at] + capitalise(text[at + len(filler) :])
        text = re.sub(r"\s{2,}", " ", text).strip()
        return persona, (text if text != task else f"{task} {tpl.brief}")
    return persona, template.format(task=task)


def neutral(task: str, axis: str, tools: Sequence[NormalizedTool], rng: random.Random) -> AugmentedTask:
    """Language-neutral rewrites for languages without templates: layout and key=value notes."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|(?<=[。！？])", task.strip()) if s.strip()]
    listed = (
        "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1))
        if len(sentences) > 1
        else f"• {task.strip()}"
    )
    if axis == "diversity":
        return AugmentedTask(text=listed, persona=None)
    if axis == "persona":  # a terse writer: one bullet per sentence
        return AugmentedTask(text="\n".join(f"- {s}" for s in sentences), persona="terse")
    found = constraint(task, tools, rng)
    if found is None:
        raise Undecidable("no language-neutral constraint to add: the tools have no open optional argument")
    return AugmentedTask(text=f"{task.rstrip()} ({found[1]})", persona=None)


def augment_task(inputs: BaseModel, rng: random.Random) -> AugmentedTask:
    assert isinstance(inputs, AugmentInput)
    task = inputs.task.strip()
    if not task:
        raise Undecidable("empty task: nothing to augment")
    lang = inputs.language.lower()[:2]
    tpl = TEMPLATES.get(lang)
    if tpl is None:
        return neutral(task, inputs.axis, inputs.tools, rng)
    if inputs.axis == "diversity":
        return AugmentedTask(text=augment_diversity(task, tpl, rng), persona=None)
    if inputs.axis == "complexity":
        return AugmentedTask(text=augment_complexity(task, tpl, inputs.tools, lang, rng), persona=None)
    persona, text = augment_persona(task, tpl, inputs.variant, rng)
    return AugmentedTask(text=text, persona=persona)


# ===================================================================================== scoring

_VALUE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("email", re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")),
    ("url", re.compile(r"https?://\S+")),
    ("date", re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")),
    ("time", re.compile(r"(?<![\d:])\d{1,2}:\d{2}(?![\d:])")),
    ("path", re.compile(r"(?:/[\w.*-]+){2,}")),
    ("quoted", re.compile(r"\"[^\"]{2,}\"|“[^”]{2,}”|«[^»]{2,}»")),
    (
        "code",
        re.compile(
            r"\b[A-Z]{2,}[A-Z0-9]*(?:-\d+)?\b|\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*\b"
        ),
    ),
    ("number", re.compile(r"(?<![A-Za-z0-9_.-])-?\d+(?:[.,]\d+)?(?![A-Za-z0-9_-])")),
    ("name", re.compile(r"(?<=[a-zà-ÿ,;] )[A-ZÀ-Ý][a-zà-ÿ]+(?: [A-ZÀ-Ý][a-zà-ÿ]+)*")),
    ("glob", re.compile(r"\*\.\w+")),
)
_REQUEST = {
    "en": r"\b(please|could you|can you|would you|i need|i want|i'd like|help me|tell me|let me know|show me)\b",
    "es": r"\b(por favor|puedes|podrías|necesito|quiero|me gustaría|ayúdame|dime)\b",
    "fr": r"\b(s'il (te|vous) pla[iî]t|peux-tu|pourriez-vous|pourrais-tu|je voudrais|j'aimerais|aide-moi|dis-moi)",
    "de": r"\b(bitte|kannst du|könntest du|könnten sie|ich möchte|ich brauche|hilf mir|sag mir|zeig mir)\b",
}
_IMPERATIVES = {
    "es": frozenset(
        "busca encuentra reserva dime muestra consulta calcula crea añade cancela obtén mira comprueba".split()
    ),
    "fr": frozenset(
        "trouve cherche réserve donne montre calcule crée ajoute annule indique vérifie consulte".split()
    ),
    "de": frozenset(
        "suche finde reserviere zeig zeige berechne erstelle füge storniere nenne gib prüfe".split()
    ),
}
_GENERAL = re.compile(
    r"\b(what is|what are|explain|in general|define|definition of|how does .{1,40} work|usually work|"
    r"tell me something|interesting about|qué es|explica|en general|qu'est-ce que|explique|en général|"
    r"was ist|erkläre|im allgemeinen)\b",
    re.IGNORECASE,
)
_PLACEHOLDER_VALUES = re.compile(
    r"\b(foo|bar|baz|asdf|xxx+|lorem|dummy|test\d*|string|undefined|null|none)\b", re.I
)
_PERIOD = re.compile(
    r"(?:from|between|del|desde|du|vom|von)\s+(\d{4}-\d{2}-\d{2})\s+(?:to|and|until|al|hasta|au|bis)\s+(\d{4}-\d{2}-\d{2})",
    re.IGNORECASE,
)


_NOT_NAMES = DOC_STOPWORDS | frozenset("what please could can would hello hi thanks also then".split())
"""Capitalised words that start a clause, not a name."""


@dataclass
class Features:
    """What the scorer measures in a task text."""

    words: int
    language: str
    values: dict[str, list[str]]
    request: float
    general: bool
    artifacts: str | None

    @property
    def value_count(self) -> int:
        return sum(len(v) for v in self.values.values())


def concrete_values(text: str) -> dict[str, list[str]]:
    """Concrete values by kind (dates, numbers, names, codes, quoted strings...), each counted once."""
    found: dict[str, list[str]] = {}
    taken: list[tuple[int, int]] = []
    for kind, pattern in _VALUE_PATTERNS:
        for m in pattern.finditer(text):
            if any(a <= m.start() < b for a, b in taken):
                continue
            if kind == "name" and m.group(0).split()[0].lower() in _NOT_NAMES:
                continue
            taken.append((m.start(), m.end()))
            found.setdefault(kind, []).append(m.group(0))
    return found


def features(text: str) -> Features:
    lang = detect_language(text)
    marker = _REQUEST.get(lang)
    if "?" in text or "¿" in text:
        request = 1.0
    elif marker is not None:
        firsts = {s.split()[0].strip(".,!:;").lower() for s in re.split(r"(?<=[.!?])\s+", text) if s.split()}
        verbs = VERBS if lang == "en" else _IMPERATIVES.get(lang, frozenset())
        request = 1.0 if re.search(marker, text, re.IGNORECASE) or firsts & verbs else 0.0
    else:
        request = 0.5  # no markers known for this language: neither credit nor blame
    problem = nonsense_problem(text)
    return Features(
        words=count_words(text),
        language=lang,
        values=concrete_values(text),
        request=request,
        general=bool(_GENERAL.search(text)),
        artifacts=problem if problem and "word(s)" not in problem else None,
    )


def question_quality(f: Features) -> tuple[float, str]:
    length = 1.0 if 8 <= f.words <= 150 else 0.5 if 5 <= f.words <= 300 else 0.0
    score = 0.25 * f.request + 0.4 * min(1.0, f.value_count / 2) + 0.15 * length + 0.2 * (f.artifacts is None)
    if f.artifacts:
        score = min(score, 0.3)
    why = f"{'a request' if f.request >= 1 else 'no clear request'}, {f.value_count} concrete value(s), {f.words} words"
    return score, why + (f", {f.artifacts}" if f.artifacts else "")


def scenario_realism(text: str, f: Features, tools: Sequence[NormalizedTool]) -> tuple[float, str]:
    score, notes = 1.0, []
    if _PLACEHOLDER_VALUES.search(_without_emails(text)):
        score -= 0.4
        notes.append("placeholder-like values")
    for a, b in _PERIOD.findall(text):
        first, second = _parse_date(a), _parse_date(b)
        if first is None or second is None:
            score -= 0.3
            notes.append("an impossible date")
        elif second < first:
            score -= 0.5
            notes.append(f"the period ends ({b}) before it starts ({a})")
    for date_text in f.values.get("date", []):
        if _parse_date(date_text) is None:
            score -= 0.3
            notes.append(f"impossible date {date_text}")
    out_of_range = _out_of_range(text, tools)
    if out_of_range:
        score -= 0.4
        notes.append(out_of_range)
    sentences = [s.strip().lower() for s in re.split(r"[.!?]", text) if s.strip()]
    if len(sentences) != len(set(sentences)):
        score -= 0.3
        notes.append("repeated sentences")
    if f.value_count == 0:
        score -= 0.25
        notes.append("no concrete situation")
    if f.words < 5:
        score -= 0.3
        notes.append("too short to describe a situation")
    return max(0.0, score), "; ".join(notes) or "plausible, consistent values"


def _without_emails(text: str) -> str:
    return re.sub(r"[\w.+-]+@[\w-]+\.[\w.]+", " ", text)


def _parse_date(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _out_of_range(text: str, tools: Sequence[NormalizedTool]) -> str | None:
    """A number stated next to an argument's name that its schema's bounds forbid."""
    folded = fold(text)
    for tool in tools:
        for arg in arguments(tool):
            low, high = arg.schema.get("minimum"), arg.schema.get("maximum")
            if low is None and high is None:
                continue
            word = humanize(arg.name).split()[-1]
            if len(word) < 4:
                continue
            near = rf"(-?\d+(?:\.\d+)?)\s+(?:\w+\s+)?{re.escape(fold(word))}|{re.escape(fold(word))}\W+(-?\d+(?:\.\d+)?)"
            for m in re.finditer(near, folded):
                value = float(m.group(1) or m.group(2))
                if (low is not None and value < float(low)) or (high is not None and value > float(high)):
                    return f"{render(value)} is outside the allowed range of {humanize(arg.name)}"
    return None


def tool_necessity(text: str, f: Features, tools: Sequence[NormalizedTool]) -> tuple[float, str]:
    stems = text_stems(text)
    overlaps = {t.function.name: len(tool_terms(t) & stems) for t in tools}
    # Across languages words cannot be matched: every tool's topic is then unknown (0.5),
    # and the values the task gives decide.
    foreign = not any(overlaps.values()) and f.language != docs_language(tools)
    best_topic, best_fit, best_tool = 0.0, 0.0, ""
    for tool in tools:
        overlap = overlaps[tool.function.name]
        if not overlap and not foreign:
            continue
        topic = 0.5 if foreign else min(1.0, overlap / 2)
        fit = arguments_fit(tool, text, f)
        if (topic + fit, tool.function.name) > (best_topic + best_fit, best_tool):
            best_topic, best_fit, best_tool = topic, fit, tool.function.name
    score = 0.45 * best_topic + 0.45 * best_fit + 0.1 * (f.value_count > 0)
    if f.value_count == 0:
        score = min(score, 0.4)
    if f.general and f.value_count == 0:
        score = min(score, 0.2)
    if not best_tool:
        return score, "nothing the tools act on is mentioned"
    about = f"in {f.language}, read against {best_tool}" if foreign else f"about what {best_tool} acts on"
    why = f"{about}; {best_fit:.0%} of its required inputs are given"
    return score, why + ("; reads as a general-knowledge question" if f.general else "")


def docs_language(tools: Sequence[NormalizedTool]) -> str:
    """Language the tool docs are written in."""
    return detect_language(" ".join(t.function.description[:200] for t in tools[:8]))


def arguments_fit(tool: NormalizedTool, text: str, f: Features) -> float:
    """Share of ``tool``'s required arguments the text gives a matching value for."""
    required = required_arguments(tool)
    if not required:
        return 1.0 if f.value_count else 0.5
    return sum(_has_value_for(arg, text, f) for arg in required) / len(required)


def _has_value_for(arg: Argument, text: str, f: Features) -> bool:
    kind, v = kind_of(arg), f.values
    if kind in ("date", "date_end", "datetime"):
        return bool(v.get("date"))
    if kind == "enum":
        return any(
            re.search(rf"(?<![\w-]){re.escape(str(e))}(?![\w-])", text, re.I) for e in enum_values(arg.schema)
        )
    checks: dict[str, bool] = {
        "email": bool(v.get("email")),
        "time": bool(v.get("time")),
        "url": bool(v.get("url")),
        "identifier": bool(v.get("code")),
        "path": bool(v.get("path")),
        "dir": bool(v.get("path")),
        "pattern": bool(v.get("glob") or v.get("quoted")),
        "boolean": True,
    }
    if kind in checks:
        return checks[kind]
    if kind in (
        "latitude",
        "longitude",
        "people",
        "quantity",
        "days",
        "years",
        "months",
        "limit",
        "rate",
        "money",
        "integer",
        "number",
    ):
        return bool(v.get("number"))
    # Names, titles, queries, cities, codes, free text, objects, lists: any specific string.
    return bool(v.get("quoted") or v.get("name") or v.get("code") or v.get("path") or v.get("number"))


def score_task(inputs: BaseModel, rng: random.Random) -> TaskScores:
    assert isinstance(inputs, TaskScoreInput)
    text = inputs.task.strip()
    if not text:
        raise Undecidable("empty task: nothing to score")
    if not inputs.tools:
        raise Undecidable("no tools: tool-use necessity cannot be judged")
    f = features(text)
    qq, qq_why = question_quality(f)
    sr, sr_why = scenario_realism(text, f, inputs.tools)
    tn, tn_why = tool_necessity(text, f, inputs.tools)
    return TaskScores(
        question_quality=round(min(1.0, qq), 3),
        scenario_realism=round(min(1.0, sr), 3),
        tool_necessity=round(min(1.0, tn), 3),
        rationale=f"Quality: {qq_why}. Realism: {sr_why}. Necessity: {tn_why}.",
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    TASK_FROM_SERVER.name: task_from_server,
    AUGMENT_TASK.name: augment_task,
    SCORE_TASK.name: score_task,
}
