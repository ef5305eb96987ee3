# The Arena image: CLI, stage workers, lake sink and trainer (CPU torch).
# Built by docker-compose.yml for the `topics`, `<track>-worker`, `lake-sink` and `trainer` services.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src

# torch first, from the CPU index: the PyPI wheel would pull GBs of CUDA libraries.
# A layer of its own, so code changes do not re-download it.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# Only what the package needs (no .venv, tests or local state in the build context copy).
COPY pyproject.toml constraints.txt README.md* ./
COPY app/ app/
COPY arena/ arena/
COPY simulator/ simulator/
COPY streams/ streams/
COPY synthesis/ synthesis/
COPY samples/ samples/
COPY producers/ producers/
COPY consumers/ consumers/
COPY environments/ environments/
COPY lake/ lake/
COPY trainer/ trainer/
COPY sandbox/ sandbox/

# The constraints pin torch==2.13.0, so no dependency can swap the CPU build for a CUDA one.
RUN pip install -c constraints.txt . && rm -rf /src/build

RUN useradd --create-home --uid 10001 arena \
    && mkdir -p /var/lib/arena \
    && chown arena:arena /var/lib/arena
USER arena
WORKDIR /home/arena
ENV ARENA_HOME=/var/lib/arena \
    OMP_NUM_THREADS=1

CMD ["arena", "--help"]
