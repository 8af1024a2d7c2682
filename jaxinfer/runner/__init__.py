"""The runner: where the host's plans meet the device's arrays.

``model_runner.ModelRunner`` owns one model's params, its paged KV cache and its compiled executables; the
``shape_plan`` lists every step shape an engine configuration can run, ``batch_packing`` pads a step's work
into one of them, ``executables`` compiles (or loads from ``compile_cache``) the whole plan at start,
``multistep`` runs several decode steps in one call, ``multihost`` replays process 0's calls on the other
processes, and ``kv_pool`` sizes the block pool.

Life of a step, from ``LLM.generate`` to the attention kernel::

    LLM.generate                          jaxinfer/llm.py            validate every prompt, then queue them
      LLMEngine.add_request               jaxinfer/llm_engine.py     core/request_io.validate_request
        OutputProcessor.add               core/output_processor.py   -> Scheduler.add (core/scheduler.py)
      LLMEngine.step (until done)         jaxinfer/llm_engine.py     schedule -> execute -> update
        Scheduler.schedule                core/scheduler.py          token budget, prefill chunks, preemption;
                                          core/block_manager.py      blocks allocated or reused (prefix cache)
        LLMEngine._execute                jaxinfer/llm_engine.py     multistep.burst_length: 1 step or N
          ModelRunner.execute             runner/model_runner.py     WorkItems of the plan's sequences
            ModelRunner.run_step          runner/model_runner.py
              ShapePlan.shape_for         runner/shape_plan.py       the planned shape that fits
              batch_packing.pack          runner/batch_packing.py    -> model/step_batch.StepBatch (numpy)
              Executables.get(("step", shape))  runner/executables.py   compiled at start (("prompt_step", shape)
                                                                     when prompt logprobs are computed:
                                                                     ModelRunner.run_prompt_step)
              step(params, kv_cache, batch)     runner/step_functions.make_step_fn, cache donated
                decoder.forward           model/decoder.py           embed, layers, final norm, LM head
                  linear                  model/linear.py            XLA dot, cpu/ffi matvec/gemm, or a
                                                                     quantization/quantized_weight matmul
                  kv_cache.write_kv       model/kv_cache.py          new K/V into their slots, in place
                  attn_fn                 model/attention.get_attention_fn, by attention_backend:
                                            "pallas": pallas_kernels/ragged_paged_attention.py
                                            "cpu":    cpu/ffi/attention.py (paged_attention.cc, ragged_attention.cc)
                                            "xla":    model/attention.xla_ragged_paged_attention
                  moe_block               model/moe.py               MoE layers (sharded: sharding/ops.py)
            choose_tokens                 runner/step_functions.py   one compiled call per step:
                                          sample/sampler.py          sample, or
                                          sample/rejection_sampler.py  verify speculative tokens
        OutputProcessor.update            core/output_processor.py   tokens appended through the stop
                                                                     conditions, blocks committed / freed,
                                                                     RequestOutputs built
        Speculator.after_step             spec_decode/speculator.py  propose the next step's drafts
"""
