/* tessera cuda backend: the attention main loops (see attention.rs and attention_mma.rs). */
