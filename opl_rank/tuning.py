"""Tuning constants: chunk sizes, unrolling and sampler thresholds, in one place.

None of them changes a result; each trades memory or compile time against run time on the
machines measured in docs/performance.md (the section each one cites). The modules read
them at call time (``tuning.NAME``), so a test or a user with an unusual machine can set one:
``opl_rank.tuning.POLICY_CHUNK_FLOATS = 2**22``.
"""

# --- memory: how much is held at once -------------------------------------------------

#: floats of per-sample intermediates held at once by OPE's model terms (opl.ope).
OPE_BATCH_FLOATS = 2**22
#: floats of intermediates per chunk of rows when a policy computes propensities (opl.policies).
POLICY_CHUNK_FLOATS = 2**24
#: rows per chunk of the second stage's completion orders (``[rows, D]`` floats; opl.learners).
COMPLETION_ORDER_ROWS = 2**14
#: rows per chunk of the learners' weight-clipping check (``[rows, D]`` logits; opl.learners).
CLIP_CHECK_ROWS = 2**16
#: R-POD with a pairwise f_hat completes every possible top-k prefix of every row once,
#: before the policy's epochs, when that table (``[n, D!/(D-k)!]`` floats) has at most this
#: many entries and costs at most half the completions the epochs would run (opl.learners;
#: docs/performance.md §20). 0: complete the sampled prefixes in every step.
PREFIX_TABLE_FLOATS = 2**26
#: floats of completion intermediates per chunk of rows while the prefix table is built.
PREFIX_TABLE_CHUNK_FLOATS = 2**23
#: exact completion of two-item tails (opl.completion.complete_exact, R-POD at k = L - 2)
#: enumerates ordered pairs of all D items, those holding a prefix item masked, while there are
#: at most this many times as many of them as pairs of the free items (docs/performance.md §30).
#: 0: always the free items' tails. Longer tails always use the free items (measured faster).
ALL_ITEM_TAILS_RATIO = 3

#: memory mappings above which a sweep process drops JAX's in-process program caches before
#: its next cell (experiments.opl_sweep). Every program a process loads keeps its code mapped
#: (three mappings per compiled object); a D = 30 regime-map cell added 10,000-20,000, and at
#: Linux's default limit of 65,530 (``vm.max_map_count``) XLA could not map new code: the
#: worker died ("LLVM compilation error: Cannot allocate memory") after a few cells.
SWEEP_MAX_MAPPINGS = 25_000
#: programs the program cache keeps on disk (opl_rank.program_cache; 30-60 KB each): beyond
#: this, the least recently used are removed down to three quarters of it (every edit of the
#: sources makes new keys, so a working checkout's folder would otherwise only grow).
PROGRAM_CACHE_MAX_ENTRIES = 4096

# --- training: how often the host hears from a run -----------------------------------

#: optimiser steps per compiled chunk of a training run at most (optimization.chunk_epochs):
#: the host reports progress and checks for early stopping between chunks; a chunk is one
#: cached program (no host callback), so this trades dispatches against silence (~0.1-2 s
#: per chunk at D = 10-100 on 2 CPU cores).
CHUNK_STEPS = 256
#: optimiser steps per call of a training run's step program (optimization.StepBlock): the
#: program sees this many batches, never the data's size, so one program per loss serves
#: every n; an epoch's last block is padded with skipped steps (docs/performance.md §28).
STEP_BLOCK = 16
#: bytes of shuffled rows one call of a run without validation may start: its epochs' batches
#: follow each other through the step program across epoch boundaries, so a small data set
#: costs a few calls per chunk of epochs instead of three per epoch (optimization.run_loop).
EPOCH_SPAN_BYTES = 2**26

#: On CPU, the programs of fit stages and ``cached_jit`` functions whose array arguments hold
#: at most this many elements in all compile with FAST_COMPILE_OPTIONS: they run for less
#: than XLA's default pipeline takes to compile them (program_cache.compiler_options;
#: docs/performance.md §27). 0 (or empty options): XLA's defaults for every program.
FAST_COMPILE_MAX_ELEMENTS = 2**17
#: XLA debug options of those programs (each unless XLA_FLAGS names it).
FAST_COMPILE_OPTIONS = (("xla_backend_optimization_level", 1), ("xla_cpu_use_fusion_emitters", False))
#: XLA debug options of every program-cached program on CPU (each unless XLA_FLAGS names it, and
#: where this jaxlib knows it): YNNPACK library fusions for matrix products only. XLA's default
#: also hands reductions and the elementwise work around them to the library, which on
#: these small row blocks made a training step of IIPS or DR about 1.5x slower
#: (program_cache.compiler_options; docs/performance.md §29). Empty: XLA's defaults.
CPU_COMPILE_OPTIONS = (("xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)

# --- kernels: unrolling and sampler choice (PL maths) ---------------------------------

#: Above this many items a sort-based top-L (``lax.top_k``) beats an L-step argmax loop on
#: CPU (pl.plackett_luce; docs/performance.md §3: top_k is slow for small D).
ARGMAX_LOOP_MAX_D = 16
#: Up to this many slots a cumulative sum is an unrolled chain of adds (the same sums in the
#: same order as ``jnp.cumsum``, bit for bit): XLA's CPU cumsum is a reduce-window, ~10x
#: slower on the short slot axis (pl.plackett_luce; docs/performance.md §5, §11).
UNROLLED_CUMSUM_MAX = 32
#: Sums over at most this many samples are unrolled chains of adds: XLA on CPU reduces over
#: a leading axis much slower than it adds the slices one by one (pl.plackett_luce;
#: docs/performance.md §14).
UNROLLED_SAMPLES_MAX = 64
#: Up to this many items the Poisson-binomial recursion of the exact marginals is unrolled
#: (fused); above, scanned (pl.marginals).
MARGINALS_UNROLL_MAX_ITEMS = 32
#: The inverse-CDF prefix sampler serves at least this many items and at most
#: PREFIX_SAMPLER_MAX_SLOTS slots; otherwise Gumbel top-k (pl.prefix_sampling;
#: docs/performance.md §13).
PREFIX_SAMPLER_MIN_ITEMS = 16
PREFIX_SAMPLER_MAX_SLOTS = 5
