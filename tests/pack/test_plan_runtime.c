/* tests/pack/test_plan_runtime.c — the memory plan against what the runtime
 * actually allocates when it loads a model (issue 8: "the plan's per-node
 * numbers equal what the runtime allocates"). Loads the EXL3 test model on
 * one node with the same ctx / users / chunk the plan is made for, and
 * compares sq_model_mem_report() with the plan's node 0 (threads = the
 * runtime's): KV must be equal; the workspace (less the logits, which the
 * runtime's caller allocates) equal up to SQ_MEMPLAN_WS_SLACK when rows match,
 * never larger; the weights the graph maps at most what the plan reserves.
 * The numbers are printed. */
#include <stdio.h>
#include <string.h>

#include "pack/pack.h"
#include "runtime/model.h"
#include "t.h"

static void compare(int ctx, int users, int chunk)
{
    const char *dir = t_data_path("exl3-model/exl3-3.0bpw");
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = ctx;
    o.n_seq = users;
    o.max_rows = chunk;
    o.n_threads = 1;
    sq_model *m = NULL;
    sparq_status st = sq_model_load(&m, dir, &o);
    CHECK_MSG(st == SPARQ_OK, "%s", sparq_errmsg());
    if (!m) return;
    sq_model_mem mem;
    sq_model_mem_report(m, &mem);
    sq_model_free(m);

    sq_pack_model pm;
    CHECK_EQ_INT(sq_pack_model_open(&pm, dir), SPARQ_OK);
    sq_pack_options po;
    sq_pack_options_default(&po);
    po.params.ctx = ctx;
    po.params.users = users;
    po.params.chunk = chunk;
    po.params.threads = 1; /* as the runtime was loaded */
    sq_memplan plan;
    CHECK_EQ_INT(sq_memplan_build(&plan, &pm.cfg, pm.tensors, pm.n_tensors, 1, &po.params, &po.budget), SPARQ_OK);
    const sq_memplan_node *n = &plan.nodes[0];
    printf("ctx %d users %d chunk %d: kv runtime %llu plan %llu | workspace runtime %llu plan %llu (incl. logits) | "
           "weights runtime %llu plan %llu\n",
           ctx, users, chunk, (unsigned long long)mem.kv, (unsigned long long)n->kv, (unsigned long long)mem.workspace,
           (unsigned long long)n->workspace,
           (unsigned long long)mem.weights, (unsigned long long)n->weights);
    CHECK_EQ_INT(mem.kv, n->kv);
    CHECK_EQ_INT(mem.plan_kv, n->kv);
    /* the runtime's caller owns the logits buffer: compare the rest */
    sq_memplan_workspace w;
    sq_memplan_workspace_terms(&pm.cfg, &po.params, true, &w);
    const uint64_t plan_ws = w.total - w.logits;
    CHECK_MSG(mem.workspace <= plan_ws, "runtime workspace %llu > plan %llu", (unsigned long long)mem.workspace,
              (unsigned long long)plan_ws);
    if (chunk >= users && mem.workspace <= plan_ws) /* same rows: exact up to the slack */
        CHECK_MSG(plan_ws - mem.workspace <= SQ_MEMPLAN_WS_SLACK, "runtime workspace %llu, plan %llu: gap %llu",
                  (unsigned long long)mem.workspace, (unsigned long long)plan_ws,
                  (unsigned long long)(plan_ws - mem.workspace));
    CHECK(mem.weights <= n->weights);
    sq_memplan_free(&plan);
    sq_pack_model_close(&pm);
}

static void test_plan_vs_runtime(void)
{
    compare(1024, 2, 64);
    compare(4096, 1, 512);
    compare(256, 8, 4);
}

int main(void)
{
    RUN(test_plan_vs_runtime);
    return t_summary();
}
