// The runs table of a batched linear-attention call (dec_conv1d, dec_delta_rule; written by the
// host, src/kernels/decoder/runs.ts): a batch's S tokens grouped by sequence, run r = one
// sequence's tokens of the call in order. Word offsets in the table (64 = the most tokens a call takes):
const uint RUN_STATE = 0u;     // run r's state index (its sequence's slot)
const uint RUN_FIRST = 64u;    // where run r's tokens start in the token list
const uint RUN_COUNT = 128u;   // run r's token count (0: no such run)
const uint RUN_TOKENS = 192u;  // the token list: each run's token indices (rows of the call's inputs), in order
