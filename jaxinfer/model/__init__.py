"""The model on the device, as pure functions over a params pytree: the decoder (``decoder.forward``), attention
and the choice between its implementations (``attention``), linear layers (``linear``), mixture-of-experts
(``moe``), the paged KV cache (``kv_cache``), the one declaration of the weights (``weights``), the step batch
pytree (``step_batch``) and the model laid over a device mesh (``sharding_plan``). It holds no request objects."""
