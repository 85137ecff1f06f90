// A C program using symm's C ABI: opens the GPU runtime from the job's environment (and, where
// there is no job or no CUDA, checks that it is refused with a status and a message), validates a
// ring all-reduce, counts rank 0 channel 0's ops by kind, encodes them as plan ops, predicts the
// cost, writes a small trace and checks its magic, and checks that an invalid request is refused
// with a message. Exits non-zero on any failure.
//
// Build and run from the workspace root (capi/tests/c_program.rs does this in the tests):
//   cargo build -p symm-capi
//   cc -std=c11 -Icapi/include capi/examples/c/validate_and_iterate.c target/debug/libsymm.a
//      -lpthread -ldl -lm -o validate_and_iterate   (one command)
//   ./validate_and_iterate

#include "symm.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            char msg_[256];                                                                    \
            symm_last_error(msg_, sizeof msg_);                                                \
            fprintf(stderr, "FAIL %s:%d: %s (last error: \"%s\"): ", __FILE__, __LINE__, #cond, \
                    msg_);                                                                     \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static symm_request ring_all_reduce(void) {
    symm_request r;
    memset(&r, 0, sizeof r);
    r.collective = SYMM_COLL_ALL_REDUCE;
    r.algorithm = SYMM_ALG_RING;
    r.dtype = SYMM_DTYPE_F32;
    r.redop = SYMM_REDOP_SUM;
    r.world = 4;
    r.channels = 2;
    r.bytes = 1 << 20;
    r.chunk_bytes = 64 << 10;
    return r;
}

// The GPU runtime: joins the job of the environment when there is one (WORLD_SIZE, RANK and
// SYMM_JOB, as symm-run sets them) and runs one all-reduce on the default stream; without the job
// or CUDA it prints why, and the program goes on with the functions that need no GPU.
static void runtime(void) {
    symm_comm_options opts;
    memset(&opts, 0, sizeof opts);
    opts.bootstrap_timeout_ms = 30000;
    symm_comm* comm = NULL;
    int st = symm_comm_from_env(&opts, &comm);
    if (st != SYMM_OK) {
        char msg[256];
        symm_last_error(msg, sizeof msg);
        CHECK(st == SYMM_ERR_UNAVAILABLE && comm == NULL && msg[0] != '\0',
              "symm_comm_from_env returned %s", symm_status_name(st));
        printf("runtime unavailable (%s): %s\n", symm_status_name(st), msg);
    } else {
        uint16_t rank = 0, world = 0;
        CHECK(symm_comm_rank(comm, &rank) == SYMM_OK && symm_comm_world(comm, &world) == SYMM_OK,
              "rank and world of the communicator");
        symm_request req = ring_all_reduce();
        req.world = world;
        symm_buffers bufs;
        st = symm_comm_alloc(comm, &req, &bufs);
        CHECK(st == SYMM_OK, "symm_comm_alloc returned %s", symm_status_name(st));
        if (st == SYMM_OK) {
            st = symm_comm_enqueue(comm, &req, &bufs, NULL);
            CHECK(st == SYMM_OK, "symm_comm_enqueue returned %s", symm_status_name(st));
            st = symm_comm_synchronize(comm, NULL);
            CHECK(st == SYMM_OK, "symm_comm_synchronize returned %s", symm_status_name(st));
            st = symm_comm_free_buffers(comm, &bufs);
            CHECK(st == SYMM_OK, "symm_comm_free_buffers returned %s", symm_status_name(st));
        }
        printf("runtime: rank %u of %u ran a ring all_reduce\n", (unsigned)rank, (unsigned)world);
        st = symm_comm_finish(comm);
        CHECK(st == SYMM_OK, "symm_comm_finish returned %s", symm_status_name(st));
    }
    // Null handles and arguments are refused with a status, never a crash.
    symm_request req = ring_all_reduce();
    symm_buffers bufs;
    memset(&bufs, 0, sizeof bufs);
    uint64_t addr = 0;
    CHECK(symm_comm_from_env(NULL, NULL) == SYMM_ERR_NULL, "a null out is refused");
    CHECK(symm_comm_alloc(NULL, &req, &bufs) == SYMM_ERR_NULL, "a null comm is refused");
    CHECK(symm_comm_enqueue(NULL, &req, &bufs, NULL) == SYMM_ERR_NULL, "a null comm is refused");
    CHECK(symm_comm_ptr(NULL, 0, 0, &addr) == SYMM_ERR_NULL, "a null comm is refused");
    CHECK(symm_comm_check(NULL) == SYMM_ERR_NULL, "a null comm is refused");
    CHECK(symm_comm_finish(NULL) == SYMM_ERR_NULL, "a null comm is refused");
    symm_comm_free(NULL);
}

int main(void) {
    CHECK(symm_abi_version() == SYMM_ABI_VERSION, "library ABI %u, header %u",
          (unsigned)symm_abi_version(), (unsigned)SYMM_ABI_VERSION);

    runtime();

    // Validation and buffer sizes.
    symm_request req = ring_all_reduce();
    int st = symm_request_validate(&req);
    CHECK(st == SYMM_OK, "validate returned %s", symm_status_name(st));
    symm_buffer_sizes sizes;
    st = symm_request_buffer_sizes(&req, &sizes);
    CHECK(st == SYMM_OK && sizes.input == req.bytes && sizes.output == req.bytes &&
              sizes.scratch > 0,
          "buffer sizes %s: in %llu out %llu scratch %llu", symm_status_name(st),
          (unsigned long long)sizes.input, (unsigned long long)sizes.output,
          (unsigned long long)sizes.scratch);

    // Rank 0, channel 0: count ops by kind and encode each as a plan op.
    symm_schedule* s = NULL;
    st = symm_schedule_new(&req, 0, 0, &s);
    CHECK(st == SYMM_OK && s != NULL, "schedule_new returned %s", symm_status_name(st));
    unsigned long long by_kind[SYMM_OP_MC_STORE + 1] = {0};
    unsigned long long total = 0, encoded = 0;
    symm_op op;
    int more;
    while (s != NULL && (more = symm_schedule_next(s, &op)) == 1) {
        total++;
        if (op.kind <= SYMM_OP_MC_STORE) {
            by_kind[op.kind]++;
        }
        uint8_t plan[SYMM_PLAN_OP_BYTES];
        symm_op back;
        if (symm_op_encode(&op, plan, sizeof plan) == SYMM_OK && plan[0] == op.kind &&
            symm_op_decode(plan, sizeof plan, &back) == SYMM_OK &&
            memcmp(&back, &op, sizeof op) == 0) {
            encoded++;
        }
    }
    if (s != NULL) {
        CHECK(more == 0, "schedule_next ended with %s", symm_status_name(more));
        uint64_t count = 0;
        st = symm_schedule_count(s, &count);
        CHECK(st == SYMM_OK && count == total, "count %llu, iterated %llu",
              (unsigned long long)count, total);
    }
    symm_schedule_free(s);
    CHECK(total > 0 && encoded == total, "%llu ops, %llu encoded and decoded", total, encoded);
    CHECK(by_kind[SYMM_OP_COPY] + by_kind[SYMM_OP_REDUCE] > 0 && by_kind[SYMM_OP_SIGNAL] > 0 &&
              by_kind[SYMM_OP_WAIT] > 0 && by_kind[SYMM_OP_MC_REDUCE] == 0,
          "unexpected op mix");
    uint8_t small[8];
    CHECK(symm_op_encode(&op, small, sizeof small) == SYMM_ERR_TOO_SMALL,
          "a short plan buffer is refused");

    // The cost model.
    symm_link link;
    double us = 0.0;
    st = symm_link_preset(SYMM_LINK_NVLINK4, &link);
    CHECK(st == SYMM_OK, "link preset %s", symm_status_name(st));
    st = symm_cost_predict(&req, &link, &us);
    CHECK(st == SYMM_OK && us > link.launch_us, "predict %s: %f us", symm_status_name(st), us);
    uint32_t best = 999;
    st = symm_cost_select(&req, &link, 0, &best);
    CHECK(st == SYMM_OK && best <= SYMM_ALG_PAIRWISE && best != SYMM_ALG_MULTICAST,
          "select %s: %u", symm_status_name(st), (unsigned)best);

    // A small trace: a begin and an end event per op of rank 0 channel 0, written backwards
    // (the writer sorts them).
    symm_trace_writer* w = NULL;
    st = symm_trace_writer_new(&req, SYMM_SOURCE_HOST_SIMULATED, 1000, 1024, &w);
    CHECK(st == SYMM_OK && w != NULL, "trace_writer_new %s", symm_status_name(st));
    st = symm_schedule_new(&req, 0, 0, &s);
    CHECK(st == SYMM_OK, "schedule_new %s", symm_status_name(st));
    unsigned events = 0;
    for (uint32_t i = 0; w != NULL && s != NULL && i < 16; i++) {
        symm_event e;
        memset(&e, 0, sizeof e);
        if (symm_schedule_next(s, &e.op) != 1) {
            break;
        }
        e.rank = 0;
        e.channel = 0;
        e.index = i;
        e.time = 100 - 2 * i;
        e.kind = SYMM_EVENT_END;
        CHECK(symm_trace_writer_event(w, &e) == SYMM_OK, "event %u", (unsigned)i);
        e.time -= 1;
        e.kind = SYMM_EVENT_BEGIN;
        CHECK(symm_trace_writer_event(w, &e) == SYMM_OK, "event %u", (unsigned)i);
        events += 2;
    }
    symm_schedule_free(s);
    if (w != NULL) {
        symm_event bad;
        memset(&bad, 0, sizeof bad);
        bad.rank = 4;
        bad.op.kind = SYMM_OP_WAIT;
        st = symm_trace_writer_event(w, &bad);
        CHECK(st == SYMM_ERR_INVALID, "an event of rank 4 in a world of 4: %s",
              symm_status_name(st));
    }
    uint8_t* trace = NULL;
    size_t trace_len = 0;
    st = symm_trace_writer_finish(w, &trace, &trace_len);
    CHECK(st == SYMM_OK && trace != NULL && trace_len > 8 &&
              memcmp(trace, SYMM_TRACE_MAGIC, 8) == 0,
          "trace_writer_finish %s, %zu bytes", symm_status_name(st), trace_len);
    symm_bytes_free(trace, trace_len);

    // An invalid request (world 0) is refused with a message; null pointers are refused.
    symm_request bad = ring_all_reduce();
    bad.world = 0;
    st = symm_request_validate(&bad);
    char msg[256] = {0};
    size_t msg_len = symm_last_error(msg, sizeof msg);
    CHECK(st == SYMM_ERR_INVALID, "world 0 gave %s", symm_status_name(st));
    CHECK(msg_len > 0 && strstr(msg, "world") != NULL, "message \"%s\"", msg);
    st = symm_cost_predict(&bad, &link, &us);
    CHECK(st == SYMM_ERR_INVALID, "predict of world 0 gave %s", symm_status_name(st));
    CHECK(symm_request_validate(NULL) == SYMM_ERR_NULL, "a null request is refused");
    CHECK(symm_schedule_next(NULL, &op) == SYMM_ERR_NULL, "a null schedule is refused");
    CHECK(symm_request_validate(&req) == SYMM_OK && symm_last_error(NULL, 0) == 0,
          "a success clears the last error");

    printf("ring all_reduce world %u, %llu bytes, %u channels: valid\n", (unsigned)req.world,
           (unsigned long long)req.bytes, (unsigned)req.channels);
    printf("rank 0 channel 0: %llu ops (copy %llu, reduce %llu, signal %llu, wait %llu), "
           "each encoded as a %d-byte plan op\n",
           total, by_kind[SYMM_OP_COPY], by_kind[SYMM_OP_REDUCE], by_kind[SYMM_OP_SIGNAL],
           by_kind[SYMM_OP_WAIT], SYMM_PLAN_OP_BYTES);
    printf("cost on NVLink 4: %.2f us; fastest algorithm code %u\n", us, (unsigned)best);
    printf("trace: %u events, %zu bytes\n", events, trace_len);
    printf("invalid request refused: %s\n", msg);
    if (failures != 0) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
