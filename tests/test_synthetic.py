"""Synthetic tasks (lab/data/synthetic): path-star graphs, induction, loss on the answer, answer accuracy.

The star-graph answers are checked against a breadth-first search of the parsed prompt, the
label masks against hand-written ones, and the answer metrics on hand-built models whose
greedy and teacher-forced outputs are known in advance.
"""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lab.data import SymbolTokenizer, build_datamodule, check_data_config
from lab.data.synthetic import InductionTask, StarGraphTask, generate_examples, pack_examples
from lab.data.synthetic.star_graph import QUERY
from lab.data.synthetic.datamodule import encode_example
from lab.data.tokenizers import tokenizer_from_identity
from lab.decode.evaluation import answer_accuracy
from lab.errors import ConfigError
from lab.labels import chain_masks, horizon_mask
from lab.model.mtp import build_model
from tests.cli import SUBPROCESS_TIMEOUT, lab_train, lab_train_in_process, read_run
from tests.helpers import bigram_model

pytestmark = pytest.mark.usefixtures("single_thread")


def parse_star_graph(prompt: list[str]) -> tuple[list[tuple[int, int]], int, int]:
    """(edges, start, goal) read back from a prompt's symbols: edges as `a b ,` triples, then the query, start and goal."""
    query = prompt.index(QUERY)
    edge_symbols = prompt[:query]
    edges = [(int(edge_symbols[i]), int(edge_symbols[i + 1])) for i in range(0, len(edge_symbols), 3)]
    return edges, int(prompt[query + 1]), int(prompt[query + 2])


def bfs_path(edges: list[tuple[int, int]], start: int, goal: int) -> list[int] | None:
    parent = {start: None}
    queue = deque([start])
    children: dict[int, list[int]] = {}
    for u, v in edges:
        children.setdefault(u, []).append(v)
    while queue:
        node = queue.popleft()
        for child in children.get(node, []):
            if child not in parent:
                parent[child] = node
                queue.append(child)
    if goal not in parent:
        return None
    path = [goal]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path[::-1]


def count_paths(edges, start, goal) -> int:
    """Distinct directed paths start → goal (a DFS; the graphs are tiny)."""
    children: dict[int, list[int]] = {}
    for u, v in edges:
        children.setdefault(u, []).append(v)
    walk = lambda node, seen: 1 if node == goal else sum(walk(c, seen | {c}) for c in children.get(node, []) if c not in seen)  # noqa: E731
    return walk(start, {start})


@pytest.mark.parametrize("degree,path_len,num_nodes", [(2, 5, 50), (3, 4, 12), (5, 2, 6), (2, 3, 5)])
def test_every_example_is_a_path_star_graph_whose_answer_is_the_bfs_path(degree, path_len, num_nodes):
    task = StarGraphTask(degree=degree, path_len=path_len, num_nodes=num_nodes)
    rng = np.random.default_rng(7)
    first_edges_from_centre = 0
    for _ in range(200):
        example = task.sample(rng)
        edges, start, goal = parse_star_graph(list(example.prompt))
        nodes = {n for edge in edges for n in edge}
        assert len(edges) == degree * (path_len - 1) and len(set(edges)) == len(edges)
        assert len(nodes) == 1 + degree * (path_len - 1) and all(0 <= n < num_nodes for n in nodes)
        out_degree = {n: sum(u == n for u, _ in edges) for n in nodes}
        in_degree = {n: sum(v == n for _, v in edges) for n in nodes}
        assert out_degree[start] == degree and in_degree[start] == 0  # start is the centre
        assert all(in_degree[n] == 1 and out_degree[n] <= 1 for n in nodes - {start})  # arms are paths
        leaves = [n for n in nodes if out_degree[n] == 0]
        assert len(leaves) == degree and goal in leaves
        for leaf in leaves:  # every arm has path_len nodes, the centre included
            assert len(bfs_path(edges, start, leaf)) == path_len
        answer = [int(s) for s in example.answer]
        assert answer == bfs_path(edges, start, goal) and count_paths(edges, start, goal) == 1
        assert example.prompt[-4:] == ("/", str(start), str(goal), "=")
        first_edges_from_centre += edges[0][0] == start
    if path_len > 2:  # the edge list is shuffled, not listed arm by arm from the centre
        assert first_edges_from_centre < 200


def test_examples_are_deterministic_per_seed_and_train_and_val_are_disjoint():
    task = StarGraphTask(degree=2, path_len=3, num_nodes=8)
    train, val = generate_examples(task, 300, 40, seed=3)
    again_train, again_val = generate_examples(task, 300, 40, seed=3)
    assert (train, val) == (again_train, again_val)
    assert generate_examples(task, 300, 40, seed=4)[1] != val
    assert generate_examples(task, 50, 40, seed=3)[1] == val  # the val set does not depend on train_examples
    val_keys = {e.key for e in val}
    assert len(val_keys) == 40 and not val_keys & {e.key for e in train}
    # 3·2 = 6 problems in all (centre, goal; the edges follow): val takes 4, train must avoid all of them.
    tiny = StarGraphTask(degree=2, path_len=2, num_nodes=3)
    train, val = generate_examples(tiny, 50, 4, seed=0)
    assert len({e.key for e in val}) == 4 and len({e.key for e in train}) == 2 and not {e.key for e in val} & {e.key for e in train}
    with pytest.raises(ConfigError, match=r"^data.val_examples: only 6 of 7"):
        generate_examples(tiny, 10, 7, seed=0)


def induction_rows(loss_on: str):
    """Two examples `a b = a b EOS` (6 tokens) of a 4-symbol induction task, packed into one 13-token row."""
    task = InductionTask(num_symbols=4, span_len=2, distance=3)
    tokenizer = SymbolTokenizer(task.symbols())
    examples = [task.sample(np.random.default_rng(s)) for s in (0, 1)]
    columns = pack_examples([encode_example(e, tokenizer, loss_on) for e in examples], seq_len=13, pad_id=tokenizer.pad_id)
    return columns, examples, tokenizer


# Answer tokens sit at 3, 4 (first example) and 9, 10 (second); 12 is padding.
ANSWER_SOURCES = {1: [2, 3, 8, 9], 2: [1, 2, 7, 8], 3: [0, 1, 6, 7]}  # t with t + k an answer token, same example


def row_mask(length: int, true_at: list[int]) -> torch.Tensor:
    mask = torch.zeros(1, length, dtype=torch.bool)
    mask[0, true_at] = True
    return mask


def test_loss_on_answer_supervises_exactly_the_answer_tokens_at_every_horizon():
    columns, examples, tokenizer = induction_rows("answer")
    assert columns["tokens"].shape == (1, 13)
    assert tokenizer.decode(columns["tokens"][0, :6].tolist()) == " ".join(examples[0].prompt + examples[0].answer)
    assert columns["active"][0].tolist() == [True] * 12 + [False]  # the prompt stays active: attention context
    assert columns["target_mask"][0].nonzero().flatten().tolist() == [3, 4, 9, 10]
    active, segments, target = columns["active"], columns["segment_ids"], columns["target_mask"]
    for k, sources in ANSWER_SOURCES.items():
        assert torch.equal(horizon_mask(active, segments, k, target), row_mask(13 - k, sources)), k
    for depth in (1, 2):  # the chain: state unchanged (prompt rows are input), loss only on answer labels
        state, loss = chain_masks(active, segments, depth, target)
        assert torch.equal(state, chain_masks(active, segments, depth)[0])
        assert torch.equal(loss, row_mask(13 - depth - 1, ANSWER_SOURCES[depth + 1])), depth
    everything, _, _ = induction_rows("all")
    assert bool(everything["target_mask"][0, :12].all()) and not everything["target_mask"][0, 12]
    for k in (1, 2, 3):
        assert torch.equal(horizon_mask(active, segments, k, everything["target_mask"]), horizon_mask(active, segments, k))


@pytest.mark.parametrize("head", [{"name": "parallel", "k": 3}, {"name": "deepseek", "k": 3}, {"name": "linear", "k": 3}])
def test_every_head_supervises_only_the_answer_and_still_reads_the_prompt(head):
    columns, _, tokenizer = induction_rows("answer")
    model = build_model({"vocab_size": tokenizer.vocab_size, "d_model": 16, "n_heads": 2, "n_layers": 4}, head)
    horizons = model(columns)
    assert [h.k for h in horizons] == [1, 2, 3]
    for h in horizons:
        assert h.mask.nonzero()[:, 1].tolist() == ANSWER_SOURCES[h.k], h.k
    # A prompt token is context: changing one (it is never a target) changes the answer rows' hidden states.
    changed = {**columns, "tokens": columns["tokens"].clone()}
    changed["tokens"][0, 0] = (changed["tokens"][0, 0] + 1) % 4
    h1, h1_changed = model(columns)[0], model(changed)[0]
    assert not torch.allclose(h1.hidden[0, 3], h1_changed.hidden[0, 3])


def test_induction_targets_equal_the_earlier_occurrence():
    task = InductionTask(num_symbols=16, span_len=5, distance=11)
    module = build_datamodule({"source": "induction", "num_symbols": 16, "span_len": 5, "distance": 11,
                               "train_examples": 64, "val_examples": 8, "seq_len": 51, "batch_size": 4})
    module.setup()
    rows = module.train_rows.as_dict()
    tokens, target = rows["tokens"], rows["target_mask"]  # [N, S]
    assert int(target.sum()) == 64 * 5
    rows_, cols = target.nonzero(as_tuple=True)
    assert bool((cols >= 11).all()) and torch.equal(tokens[rows_, cols], tokens[rows_, cols - 11])
    example = task.sample(np.random.default_rng(0))
    doc = list(example.prompt + example.answer)
    assert len(doc) == 11 + 5 and doc[10] == "=" and all(doc[p] == doc[p - 11] for p in range(11, 16))


EXAMPLES = [([1, 2], [3, 4]), ([5, 2], [3, 4]), ([6], [7, 8])]


def answer_rates(scores: dict) -> dict:
    """The three rates this file checks (tests/test_answer_metrics.py checks the rest)."""
    return {name: scores[name] for name in ("answer_exact", "answer_token_acc", "answer_tf_acc")}


def test_answer_accuracy_scores_a_perfect_and_a_wrong_model():
    perfect = bigram_model(10, {2: 3, 3: 4, 6: 7, 7: 8})
    assert answer_rates(answer_accuracy(perfect, EXAMPLES)) == {"answer_exact": 1.0, "answer_token_acc": 1.0, "answer_tf_acc": 1.0}
    # Wrong first step after 2 (→ 9), then 9 → 4: greedy [9, 4] (1 of 2 right, at the second position), while
    # teacher forcing sees the true 3 and predicts 4. After 6 everything is wrong (6 → 0, 7 → 0, 0 → 0).
    wrong = bigram_model(10, {2: 9, 9: 4, 3: 4, 6: 0, 7: 0})
    assert answer_rates(answer_accuracy(wrong, EXAMPLES)) == {
        "answer_exact": 0.0,
        "answer_token_acc": 2 / 6,  # the two 4s
        "answer_tf_acc": 2 / 6,  # 3 → 4 in the first two examples
    }
    # The Clever-Hans signature: teacher forcing right after the first answer token, greedy lost at the first step.
    hans = bigram_model(10, {2: 9, 9: 0, 3: 4, 6: 7, 7: 8})
    scores = answer_accuracy(hans, EXAMPLES)
    assert scores["answer_exact"] == pytest.approx(1 / 3) and scores["answer_tf_acc"] == pytest.approx(4 / 6)
    assert scores["answer_token_acc"] == pytest.approx(2 / 6)


def test_symbol_tokenizer_round_trips_and_is_rebuilt_from_its_identity():
    tokenizer = SymbolTokenizer(StarGraphTask(degree=2, path_len=3, num_nodes=5).symbols())
    text = "0 1 | 1 2 | / 0 2 = 0 1 2"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids + [tokenizer.eos_id, tokenizer.pad_id]) == text
    assert tokenizer.vocab_size == 5 + 3 + 3 and max(ids) < tokenizer.bos_id
    rebuilt = tokenizer_from_identity(json.loads(json.dumps(tokenizer.identity)))
    assert rebuilt.identity == tokenizer.identity and rebuilt.encode(text) == ids
    with pytest.raises(ConfigError, match=r"^prompt: unknown symbol\(s\) 7"):
        tokenizer.encode("0 7")


@pytest.mark.parametrize(
    "options,field",
    [
        ({"num_nodes": 8}, "data.num_nodes"),  # G(2, 5) needs 9 ids
        ({"degree": 1}, "data.degree"),
        ({"loss_on": "prompt"}, "data.loss_on"),
        ({"seq_len": 20}, "data.seq_len"),  # an example has 34 tokens
        ({"max_docs": 3}, "data.max_docs"),  # a text-source option
        ({"path_len": True}, "data.path_len"),
    ],
)
def test_bad_star_graph_config_names_the_field(options, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        check_data_config({"source": "star_graph", **options})


def test_induction_distance_must_leave_room_for_the_marker():
    with pytest.raises(ConfigError, match=r"^data.distance: must be ≥ span_len \+ 1 = 9"):
        check_data_config({"source": "induction", "span_len": 8, "distance": 8})


CLI_SMALL = [
    "model.d_model=32", "model.n_layers=4", "model.n_heads=2", "data.train_examples=400", "data.val_examples=32",
    "data.answer_examples=8", "trainer.max_steps=20", "trainer.val_check_interval=10", "trainer.log_every_n_steps=5",
    "optim.warmup_steps=2", "trainer.enable_progress_bar=false", "callbacks.decoding.prompts=1", "callbacks.decoding.new_tokens=8",
]


@pytest.mark.parametrize("source,answer_tokens", [("star_graph", 5), ("induction", 8)])
def test_twenty_steps_of_each_task_through_the_cli(tmp_path, cache_dir, source, answer_tokens):
    """20 steps through lab-train: answer metrics in run.json, and the checkpoint's tokenizer is the task's."""
    run = tmp_path / "run"
    result = lab_train(f"data={source}", "head=parallel", "head.k=2", *CLI_SMALL, f"hydra.run.dir={run}",
                       cache_dir=cache_dir, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_run(run)
    assert record["status"] == "ok" and record["config"]["data"]["source"] == source
    final = record["final_metrics"]
    for name in ("val/answer_exact", "val/answer_token_acc", "val/answer_tf_acc"):
        assert 0.0 <= final[name] <= 1.0, name
    assert "val/answer_exact" in (run / "metrics.csv").read_text().splitlines()[0]
    assert record["manifest"]["tokenizer"]["kind"] == "symbols"
    assert record["corpus_stats"]["n_examples_train"] == 400 and record["corpus_stats"]["answer_tokens"] == answer_tokens
    from lab.decode.loading import load_for_generation

    loaded = load_for_generation(run)  # what lab-generate decodes with
    assert loaded.tokenizer.identity == record["manifest"]["tokenizer"]
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("0 1 2 =")) == "0 1 2 ="


def test_bad_synthetic_option_fails_before_the_run(tmp_path, cache_dir):
    result = lab_train_in_process("data=star_graph", "data.num_nodes=4", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("error: data.num_nodes: must be ≥ 1 + degree")
    assert not (tmp_path / "outputs").exists()


def test_the_long_star_graph_preset_is_the_papers_graph_on_a_bigger_model():
    """`preset=long` (documented for a GPU, never trained here) composes, checks and builds."""
    from hydra import compose, initialize_config_dir

    from lab.train import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["experiment=star_graph", "preset=long", "variant=parallel_k4"])
    data = check_data_config(OmegaConf.to_container(cfg.data, resolve=True))
    assert (data.task.degree, data.task.path_len, data.task.num_nodes, data.train_examples) == (2, 5, 50, 200_000)
    model_cfg = {**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": 56}
    model_cfg.pop("compile")  # a run option, not part of the network
    model = build_model(model_cfg, OmegaConf.to_container(cfg.head, resolve=True))
    assert model.k == 4 and cfg.model.d_model == 384 and cfg.trainer.max_steps == 20_000
