"""The host side of the engine, without JAX: a sequence's state (``sequence``), request intake and stop
conditions (``request_io``), the paged block pool with its prefix cache (``block_manager``), continuous batching
(``scheduler``), applying a step's tokens and building outputs (``output_processor``), and text <-> ids
(``tokenizer``). ``tests/test_architecture.py`` imports all of it with JAX refused."""
