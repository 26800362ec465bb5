/* quantize/report.c — the run's report (driver.h qz_report): the per-tensor
 * list the stages append to, and its files: JSON (options, timing, memory
 * estimate and measured peak, per-layer and per-tensor errors) and an SVG
 * plot of the error by layer. The human table is cli/cmd_quantize.c's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "quantize/job.h"

void qz_report_free(qz_report *r)
{
    sparq_free(r->tensors);
    sparq_free(r->layers);
    memset(r, 0, sizeof *r);
}

sparq_status qz_report_add_tensor(qz_report *r, const char *key, int K, int k, int n, double proxy)
{
    if (r->n_tensors == r->cap_tensors) {
        int cap = r->cap_tensors ? 2 * r->cap_tensors : 256;
        qz_tensor_stat *t = sparq_realloc(r->tensors, (size_t)cap * sizeof *t);
        RETURN_IF(!t, SPARQ_E_NOMEM, "out of memory for the report");
        r->tensors = t;
        r->cap_tensors = cap;
    }
    qz_tensor_stat *t = &r->tensors[r->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%.191s", key);
    t->K = K, t->k = k, t->n = n, t->proxy_err = proxy;
    return SPARQ_OK;
}

sparq_status qz_report_write_json(const qz_report *r, const qz_opts *o, const char *path)
{
    json_t *root = json_object(), *layers = json_array(), *tensors = json_array();
    json_object_set_new(root, "method", json_string(qz_method_name(o->method)));
    json_object_set_new(root, "bits", json_real(o->bits));
    json_object_set_new(root, "head_bits", json_integer(o->head_bits));
    json_object_set_new(root, "codebook", json_string(trellis_cb_name(o->cb)));
    json_object_set_new(root, "calib_rows", json_integer(r->calib_rows));
    json_object_set_new(root, "calib_len", json_integer(r->calib_len));
    json_object_set_new(root, "random_rows", json_integer(r->random_rows));
    json_object_set_new(root, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(root, "weights_quantized", json_integer((json_int_t)r->n_weights));
    json_object_set_new(root, "quant_seconds", json_real(r->quant_seconds));
    json_object_set_new(root, "gpu_seconds", json_real(r->gpu_seconds));
    json_object_set_new(root, "device", json_string(o->device == QZ_DEVICE_CUDA ? "cuda" : "cpu"));
    json_t *gd = json_array(); /* per --devices entry: its ordinal and busy seconds */
    for (int i = 0; i < r->n_devices; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "device", json_integer(r->devices[i]));
        json_object_set_new(x, "gpu_seconds", json_real(r->gpu_seconds_dev[i]));
        json_array_append_new(gd, x);
    }
    json_object_set_new(root, "gpu_devices", gd);
    json_object_set_new(root, "weights_per_second",
                        json_real(r->quant_seconds > 0 ? (double)r->n_weights / r->quant_seconds : 0.0));
    json_object_set_new(root, "total_seconds", json_real(r->total_seconds));
    json_object_set_new(root, "peak_rss_bytes", json_integer((json_int_t)r->peak_rss));
    json_object_set_new(root, "mem_estimate_bytes", json_integer((json_int_t)r->mem_estimate));
    json_object_set_new(root, "max_mem_bytes", json_integer((json_int_t)o->max_mem));
    json_t *parts = json_array();
    for (int i = 0; i < r->n_mem_parts; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "what", json_string(r->mem_parts[i].what));
        json_object_set_new(x, "bytes", json_integer((json_int_t)r->mem_parts[i].bytes));
        json_array_append_new(parts, x);
    }
    json_object_set_new(root, "mem_estimate_parts", parts);
    json_object_set_new(root, "source_skeleton", json_boolean(r->skeleton));
    json_object_set_new(root, "resumed_layers", json_integer(r->resumed_layers));
    if (r->quality_tokens > 0) {
        json_t *q = json_object();
        json_object_set_new(q, "tokens", json_integer(r->quality_tokens));
        json_object_set_new(q, "kld", json_real(r->quality_kld));
        json_object_set_new(q, "top1", json_real(r->quality_top1));
        json_object_set_new(q, "ppl_source", json_real(r->quality_ppl_source));
        json_object_set_new(q, "ppl_output", json_real(r->quality_ppl_output));
        json_object_set_new(root, "quality", q);
    }
    for (int i = 0; i < r->n_layers; i++) {
        const qz_layer_stat *l = &r->layers[i];
        json_t *x = json_object();
        json_object_set_new(x, "layer", json_integer(l->layer));
        json_object_set_new(x, "rel_err", json_real(l->rel_err));
        json_object_set_new(x, "cosine", json_real(l->cosine));
        json_object_set_new(x, "sqnr_db", json_real(l->sqnr_db));
        json_object_set_new(x, "mean_proxy_err", json_real(l->mean_proxy));
        json_object_set_new(x, "max_proxy_err", json_real(l->max_proxy));
        json_object_set_new(x, "seconds", json_real(l->seconds));
        json_object_set_new(x, "weights", json_integer((json_int_t)l->n_weights));
        json_object_set_new(x, "quant_seconds", json_real(l->quant_seconds));
        json_object_set_new(x, "weights_per_second",
                            json_real(l->quant_seconds > 0 ? (double)l->n_weights / l->quant_seconds : 0.0));
        json_object_set_new(x, "resumed", json_boolean(l->resumed));
        json_array_append_new(layers, x);
    }
    for (int i = 0; i < r->n_tensors; i++) {
        const qz_tensor_stat *t = &r->tensors[i];
        json_t *x = json_object();
        json_object_set_new(x, "key", json_string(t->key));
        json_object_set_new(x, "bits", json_integer(t->K));
        json_object_set_new(x, "in", json_integer(t->k));
        json_object_set_new(x, "out", json_integer(t->n));
        json_object_set_new(x, "proxy_err", json_real(t->proxy_err));
        json_array_append_new(tensors, x);
    }
    json_object_set_new(root, "layers", layers);
    json_object_set_new(root, "tensors", tensors);
    sparq_status st = qz_write_json(path, root);
    json_decref(root);
    return st;
}

sparq_status qz_report_write_svg(const qz_report *r, const char *path)
{
    const int W = 640, H = 320, ml = 60, mr = 20, mt = 30, mb = 40;
    double ymax = 1e-6;
    for (int i = 0; i < r->n_layers; i++) ymax = fmax(ymax, fmax(r->layers[i].rel_err, r->layers[i].mean_proxy));
    ymax *= 1.1;
    size_t cap = 8192 + (size_t)r->n_layers * 256;
    char *s = sparq_malloc(cap);
    RETURN_IF(!s, SPARQ_E_NOMEM, "out of memory");
    int n = snprintf(s, cap,
                     "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                     "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                     "<text x=\"%d\" y=\"18\" font-size=\"13\">error by layer: hidden-state rel. error (blue), "
                     "mean proxy error (orange)</text>\n"
                     "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
                     "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
                     "<text x=\"5\" y=\"%d\">%.3g</text><text x=\"5\" y=\"%d\">0</text>\n"
                     "<text x=\"%d\" y=\"%d\">layer</text>\n",
                     W, H, ml, ml, H - mb, W - mr, H - mb, ml, mt, ml, H - mb, mt + 4, ymax, H - mb, W / 2, H - 8);
    const char *colors[2] = {"#1f77b4", "#ff7f0e"};
    for (int series = 0; series < 2; series++) {
        n += snprintf(s + n, cap - (size_t)n, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                      colors[series]);
        for (int i = 0; i < r->n_layers; i++) {
            double v = series == 0 ? r->layers[i].rel_err : r->layers[i].mean_proxy;
            double x = ml + (r->n_layers > 1 ? (double)i / (r->n_layers - 1) : 0.5) * (W - ml - mr);
            double y = (H - mb) - v / ymax * (H - mb - mt);
            n += snprintf(s + n, cap - (size_t)n, "%.1f,%.1f ", x, y);
        }
        n += snprintf(s + n, cap - (size_t)n, "\"/>\n");
    }
    for (int i = 0; i < r->n_layers; i++) {
        double x = ml + (r->n_layers > 1 ? (double)i / (r->n_layers - 1) : 0.5) * (W - ml - mr);
        n += snprintf(s + n, cap - (size_t)n, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x,
                      H - mb + 14, r->layers[i].layer);
    }
    n += snprintf(s + n, cap - (size_t)n, "</svg>\n");
    sparq_status st = sparq_file_write_atomic(path, s, (size_t)n);
    sparq_free(s);
    return st;
}
