"""The lean image run as an operator runs it (``--read-only --cap-drop ALL
--security-opt no-new-privileges``, host network) in front of the real Dynamo
1.6.1 frontend and mocker (issue 29).

One proxy container for the module, with the reference taps and a third tap
recording the output text; its responses are compared with Dynamo's own
answers and with what the taps recorded; a consumer run from the image counts
the records, and /metrics counts them too. SIGTERM gets a container of its own.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from shadow_proxy.devtools.dynamo import Dynamo
from shadow_proxy.devtools.processes import reserve_endpoint, reserve_port, wait_until
from shadow_proxy.devtools.reference_taps import proxy_config, reference_taps, write_config
from tests.image.conftest import Images, Podman, run_detached, running, wait_ready
from tests.support import MODELS_DIR
from tests.support.dynamo import dynamo_with_mockers
from tests.support.subscriber import TapSubscriber

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(600)]
in_module_loop = pytest.mark.asyncio(loop_scope="module")

#: ~6 ms per output token: a 400-token stream lasts seconds (for SIGTERM).
SPEEDUP = 1.0
GRACE_S = 20
TEXT_TAP = "text"
TIMEOUT = aiohttp.ClientTimeout(total=120)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dynamo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Dynamo]:
    async with dynamo_with_mockers(tmp_path_factory.mktemp("dynamo"), SPEEDUP) as dynamo:
        yield dynamo


def container_config(directory: Path, dynamo: Dynamo, **overrides) -> tuple[Path, dict]:
    """A config for the container: Dynamo's models from /models, the reference
    taps plus one that records output text, on reserved loopback ports."""
    taps = reference_taps([reserve_endpoint() for _ in range(2)])
    taps.append(
        {
            "name": TEXT_TAP,
            "capture": "request_response",
            "emit": "joined",
            "response": {"tokens": True, "text": True},
            "endpoint": reserve_endpoint(),
        }
    )
    overrides.setdefault("models", {"deepseek": "/models/deepseek", "chatml": "/models/chatml"})
    mapping = proxy_config(
        dynamo.base_url,
        port=reserve_port(),
        taps=taps,
        shutdown_grace_s=GRACE_S,
        worker={"processes": 2},
        **overrides,
    )
    directory.mkdir(parents=True, exist_ok=True)
    return write_config(directory / "config.yaml", mapping), mapping


class Proxy:
    def __init__(self, name: str, mapping: dict, ready_s: float) -> None:
        self.name, self.mapping, self.ready_s = name, mapping, ready_s
        self.url = f"http://127.0.0.1:{mapping['listen']['port']}"
        self.taps = {t["name"]: t for t in mapping["taps"]}

    async def metrics(self) -> str:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            async with session.get(self.url + "/metrics") as response:
                return await response.text()

    async def sample(self, name: str, **labels: str) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = "^" + re.escape(name + ("{" + wanted + "}" if labels else "")) + r" (\S+)$"
        found = re.search(pattern, await self.metrics(), re.MULTILINE)
        return float(found[1]) if found else 0.0


async def start_proxy(podman: Podman, image: str, directory: Path, dynamo: Dynamo) -> Proxy:
    config, mapping = container_config(directory, dynamo)
    started = time.monotonic()
    name = run_detached(
        podman,
        "proxy",
        image,
        [],
        volumes={MODELS_DIR: "/models:ro", config: "/etc/shadow-proxy/config.yaml:ro"},
    )
    url = f"http://127.0.0.1:{mapping['listen']['port']}/readyz"
    await wait_ready(podman, name, url)
    return Proxy(name, mapping, time.monotonic() - started)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(images: Images, podman: Podman, dynamo: Dynamo, tmp_path_factory):
    proxy = await start_proxy(podman, images.lean, tmp_path_factory.mktemp("proxy"), dynamo)
    print(f"\nlean image: `podman run` to /readyz 200 in {proxy.ready_s:.2f} s")
    yield proxy
    podman("rm", "--force", "--time", "5", proxy.name, check=False)


@pytest.fixture(scope="module")
def subscribers(proxy: Proxy):
    subs = {
        name: TapSubscriber(t["endpoint"], t.get("topic", f"shadow-requests-{name}"))
        for name, t in proxy.taps.items()
    }
    yield subs
    for sub in subs.values():
        sub.close()


async def post(session: aiohttp.ClientSession, url: str, path: str, body: dict):
    async with session.post(url + path, json=body) as response:
        return response.status, response.headers, await response.read()


def shape(value):
    """The keys of a JSON value, recursively (the mocker's tokens are random)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def _sorted_listing(body: bytes) -> dict:
    listing = json.loads(body)
    listing["data"] = sorted(listing["data"], key=lambda model: model["id"])
    return listing


def sse_events(body: bytes) -> list:
    return [line[6:].decode() for line in body.split(b"\n") if line.startswith(b"data: ")]


@in_module_loop
class TestServing:
    """What the client gets through the image is what Dynamo answers."""

    async def test_models_are_the_frontends_bytes(self, proxy: Proxy, dynamo: Dynamo) -> None:
        # Dynamo lists its models in hash-map order, which may differ from one call to the
        # next: the bytes are compared as a length and as the listing with its entries sorted.
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            async with session.get(proxy.url + "/v1/models") as proxied:
                via = (proxied.status, await proxied.read())
            async with session.get(dynamo.base_url + "/v1/models") as direct:
                straight = (direct.status, await direct.read())
        assert via[0] == straight[0] == 200
        assert len(via[1]) == len(straight[1])
        assert _sorted_listing(via[1]) == _sorted_listing(straight[1])

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi, 世界 🙂"}]}),
            ("/v1/completions", {"prompt": "Count to three:"}),
        ],
        ids=["chat", "completions"],
    )
    async def test_answers_equal_dynamos_and_the_records(
        self, proxy: Proxy, dynamo: Dynamo, subscribers, path: str, body: dict
    ) -> None:
        for sub in subscribers.values():
            await sub.wait_heartbeats(timeout=30)
        request = {"model": "deepseek", "max_tokens": 8, **body}
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            status, headers, via = await post(session, proxy.url, path, request)
            d_status, _, direct = await post(session, dynamo.base_url, path, request)
        assert status == d_status == 200
        via_json, direct_json = json.loads(via), json.loads(direct)
        assert shape(via_json) == shape(direct_json)
        assert via_json["usage"] == direct_json["usage"]
        rid = headers["x-request-id"]
        record = (await subscribers[TEXT_TAP].wait_requests([rid], 30))[rid]
        response = record["response"]
        assert response["upstream_id"] == via_json["id"]
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")
        assert {k: response["usage"][k] for k in counts} == {
            k: via_json["usage"][k] for k in counts
        }
        (choice,) = via_json["choices"]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        assert response["choices"][0]["text"] == text
        assert response["choices"][0]["finish_reason"] == choice["finish_reason"]
        assert response["output_tokens"] == via_json["usage"]["completion_tokens"]
        prompt = (await subscribers["kv-history-tracker"].wait_requests([rid], 30))[rid]
        assert len(prompt["request"]["token_ids"]) == via_json["usage"]["prompt_tokens"]

    async def test_a_stream_is_dynamos_events_and_the_record(
        self, proxy: Proxy, dynamo: Dynamo, subscribers
    ) -> None:
        await subscribers[TEXT_TAP].wait_heartbeats(timeout=30)
        request = {
            "model": "deepseek",
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            status, headers, via = await post(session, proxy.url, "/v1/chat/completions", request)
            _, d_headers, direct = await post(
                session, dynamo.base_url, "/v1/chat/completions", request
            )
        assert status == 200
        assert headers["content-type"] == d_headers["content-type"]
        events, direct_events = sse_events(via), sse_events(direct)
        assert events[-1] == direct_events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        direct_chunks = [json.loads(e) for e in direct_events[:-1]]
        # Chunk by chunk the random tokens differ (the first may carry content
        # or not): the kinds of chunk and the usage are Dynamo's.
        assert {tuple(sorted(c)) for c in chunks} == {tuple(sorted(c)) for c in direct_chunks}
        assert chunks[-1]["usage"] == direct_chunks[-1]["usage"]
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        rid = headers["x-request-id"]
        record = (await subscribers[TEXT_TAP].wait_requests([rid], 30))[rid]
        assert text, "the mocker's deepseek answers carry text"
        assert record["response"]["choices"][0]["text"] == text
        assert record["response"]["outcome"] == "complete"


@in_module_loop
class TestTheConsumerImage:
    """Records arrive at a consumer run from the image; /metrics counts them."""

    async def test_records_arrive_and_metrics_count_them(
        self, proxy: Proxy, podman: Podman, images: Images, tmp_path: Path
    ) -> None:
        out = tmp_path / "out"
        out.mkdir()
        out.chmod(0o777)  # the consumer runs as uid 10001
        consumer = run_detached(
            podman,
            "consumer",
            images.lean,
            [
                "--discover",
                f"{proxy.url}/shadow/taps",
                "--tap",
                "shadow-replay",
                "--interval",
                "0.2",
                "--summary-path",
                "/out/summary.json",
            ],
            entrypoint="shadow-consumer",
            volumes={out: "/out"},
        )

        def summary() -> dict:
            try:
                return json.loads((out / "summary.json").read_text())
            except (OSError, ValueError):
                return {}

        # Subscribed once a heartbeat has come (no slow joiner).
        await wait_until(
            lambda: any(p["heartbeats"] for p in summary().get("publishers", [])),
            30,
            what="the consumer container's first heartbeat",
        )
        before = await proxy.sample("shadow_tap_published_total", tap="shadow-replay")
        n = 20
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            for i in range(n):
                body = {
                    "model": "deepseek",
                    "messages": [{"role": "user", "content": f"request {i}"}],
                    "max_tokens": 3,
                }
                status, _, _ = await post(session, proxy.url, "/v1/chat/completions", body)
                assert status == 200
        await wait_until(
            lambda: summary().get("records", 0) >= n, 30, what=f"{n} records at the consumer"
        )
        health = podman("healthcheck", "run", consumer, check=False)
        assert health.returncode == 0, "a consumer container is healthy while it runs"
        podman("kill", "--signal", "TERM", consumer)
        assert podman("wait", consumer, timeout=30).stdout.strip() == "0"
        final = summary()  # rewritten at exit
        assert final["records"] == n
        assert final["outcomes"] == {"complete": n}
        assert final["tap_gaps"] == final["transport_gaps"] == 0
        after = await proxy.sample("shadow_tap_published_total", tap="shadow-replay")
        assert after - before == n


@in_module_loop
class TestTheContainer:
    """Locked down as asked, healthy by its own check, /metrics times that are times."""

    async def test_uid_10001_no_capabilities_read_only(self, proxy: Proxy, podman: Podman) -> None:
        status = podman("exec", proxy.name, "cat", "/proc/1/status").stdout
        assert re.search(r"(?m)^Uid:\s+10001\s+10001\s+10001\s+10001$", status), status
        assert re.search(r"(?m)^CapEff:\s+0+$", status), status
        assert re.search(r"(?m)^NoNewPrivs:\s+1$", status), status
        touched = podman("exec", proxy.name, "touch", "/opt/x", check=False)
        assert touched.returncode != 0 and "Read-only file system" in touched.stderr

    async def test_the_health_check_probes_the_configured_port(
        self, proxy: Proxy, podman: Podman
    ) -> None:
        port = proxy.mapping["listen"]["port"]
        assert port != 8080
        done = podman("healthcheck", "run", proxy.name, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    async def test_the_worker_runs_on_jemalloc(self, proxy: Proxy, podman: Podman) -> None:
        """The image ships libjemalloc2, and ``worker.malloc: auto`` preloads it in the
        worker's processes (not in the serving process, pid 1)."""

        async def both_shards() -> bool:
            library = "libjemalloc.so.2"
            return await proxy.sample("shadow_worker_malloc_processes", library=library) == 2

        # The shards' gauges reach /metrics with the worker's next snapshot (each second).
        await wait_until(both_shards, 10, what="2 shards on libjemalloc.so.2 in /metrics")
        assert "serve" in podman("exec", proxy.name, "cat", "/proc/1/cmdline").stdout
        maps = podman("exec", proxy.name, "cat", "/proc/1/maps").stdout
        assert "libjemalloc" not in maps

    async def test_created_samples_are_times_not_sums(self, proxy: Proxy) -> None:
        """Issue 29 item 6: with two shards, ``*_created`` read twice the clock."""

        async def two_shards() -> bool:
            return await proxy.sample("shadow_worker_processes") == 2

        await wait_until(two_shards, 10, what="2 shards in /metrics")
        text = await proxy.metrics()
        created = [float(v) for v in re.findall(r"(?m)^shadow_\w+_created(?:\{.*\})? (\S+)$", text)]
        assert created, "no _created sample"
        now = time.time()
        assert all(now - 3600 < c <= now + 1 for c in created), sorted(set(created))[-3:]


@in_module_loop
class TestShutdown:
    """SIGTERM finishes the stream in flight, then the proxy exits 0 within the grace."""

    async def test_sigterm_finishes_an_in_flight_stream(
        self, images: Images, podman: Podman, dynamo: Dynamo, tmp_path: Path
    ) -> None:
        proxy = await start_proxy(podman, images.lean, tmp_path, dynamo)
        request = {
            "model": "deepseek",
            "messages": [{"role": "user", "content": "A long answer, please."}],
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            async with session.post(proxy.url + "/v1/chat/completions", json=request) as response:
                assert response.status == 200
                body = await response.content.readuntil(b"\n\n")  # the stream is under way
                signalled = time.monotonic()
                podman("kill", "--signal", "TERM", proxy.name)
                body += await response.read()
        exit_code = podman("wait", proxy.name, timeout=GRACE_S + 30).stdout.strip()
        elapsed = time.monotonic() - signalled
        events = sse_events(body)
        assert events[-1] == "[DONE]"
        finish = [json.loads(e)["choices"][0].get("finish_reason") for e in events[:-1]]
        assert finish[-1] == "length", "the stream ran to its end"
        assert exit_code == "0", podman.logs(proxy.name)[-2000:]
        assert elapsed < GRACE_S + 10, f"exited {elapsed:.1f} s after SIGTERM"
        print(f"\nSIGTERM mid-stream: the stream finished, exit 0 after {elapsed:.1f} s")
        assert not running(podman, proxy.name)


def jinja2_config(directory: Path, dynamo: Dynamo) -> tuple[Path, dict]:
    """The chatml model rendered by transformers' jinja2, as vLLM would."""
    model = {"name": "chatml", "tokenizer": "/models/chatml", "template_engine": "jinja2"}
    return container_config(directory, dynamo, models=[model])


@in_module_loop
class TestVariants:
    """A ``jinja2`` model: one clear line from the lean image, served by the full one."""

    async def test_lean_refuses_a_jinja2_model_in_one_line(
        self, images: Images, podman: Podman, dynamo: Dynamo, tmp_path: Path
    ) -> None:
        config, _ = jinja2_config(tmp_path, dynamo)
        done = podman(
            "run",
            "--rm",
            "--network",
            "host",
            "--read-only",
            "-v",
            f"{MODELS_DIR}:/models:ro",
            "-v",
            f"{config}:/etc/shadow-proxy/config.yaml:ro",
            images.lean,
            check=False,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert "needs transformers" in done.stderr and "Traceback" not in done.stderr

    async def test_full_serves_a_jinja2_model(
        self, images: Images, podman: Podman, dynamo: Dynamo, tmp_path: Path
    ) -> None:
        config, mapping = jinja2_config(tmp_path, dynamo)
        name = run_detached(
            podman,
            "full",
            images.full,
            [],
            volumes={MODELS_DIR: "/models:ro", config: "/etc/shadow-proxy/config.yaml:ro"},
        )
        proxy = Proxy(name, mapping, 0.0)
        try:
            proxy.ready_s = await wait_ready(podman, name, proxy.url + "/readyz")
            print(f"\nfull image, a jinja2 model: ready in {proxy.ready_s:.2f} s")
            tap = proxy.taps["kv-history-tracker"]
            with TapSubscriber(tap["endpoint"], tap["topic"]) as sub:
                await sub.wait_heartbeats(timeout=30)
                body = {
                    "model": "chatml",
                    "messages": [{"role": "user", "content": f"hello {uuid.uuid4().hex}"}],
                    "max_tokens": 2,
                }
                async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                    status, headers, answer = await post(
                        session, proxy.url, "/v1/chat/completions", body
                    )
                assert status == 200
                rid = headers["x-request-id"]
                record = (await sub.wait_requests([rid], 30))[rid]
            prompt_tokens = json.loads(answer)["usage"]["prompt_tokens"]
            assert len(record["request"]["token_ids"]) == prompt_tokens
        finally:
            podman("rm", "--force", "--time", "5", name, check=False)
