/* cli/cmd_tokenize.c — `sparq tokenize`: text -> token ids and back, with the
 * model's tokenizer (formats/tokenizer.h). For users checking prompts and
 * for tests comparing against HF tokenizers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "formats/tokenizer.h"

static const cli_opt opts[] = {
    {"ids", 0, NULL, "text -> ids (the default): ids on one line, separated by single spaces"},
    {"text", 0, NULL, "ids -> text: read ids separated by whitespace, write the decoded text as is"},
    {"special", 0, NULL, "encode: turn special-token text such as <|im_end|> into its id (default: encode it "
                         "as plain text)"},
    {"skip-special", 0, NULL, "decode: leave special tokens out of the text"},
    {"file", 'f', "FILE", "read FILE instead of standard input"},
    {"info", 0, NULL, "print vocab size, special ids and the chat template family, then exit"},
    {"chat", 0, NULL, "input: a JSON array of {\"role\": system|user|assistant, \"content\": ...}; apply the "
                      "model's chat template with the generation prompt, then encode it (special tokens parsed)"},
    {"render", 0, NULL, "with --chat: print the rendered prompt text instead of its ids"},
    {"no-generation-prompt", 0, NULL, "with --chat: do not end with the assistant's generation prompt"},
    {0}};
static const cli_spec spec = {
    "tokenize", "MODEL [--ids|--text|--chat] [--special] [-f FILE] < input",
    "Tokenize text with MODEL's tokenizer.json (MODEL: a model directory or a tokenizer.json file). With "
    "--ids (default) the input is UTF-8 text and the output is its token ids on one line, separated by "
    "spaces; nothing is added (no BOS). With --text the input is ids and the output the decoded text. "
    "Invalid UTF-8 input is an error that gives the byte offset.",
    opts, "examples:\n  printf 'Hello world' | sparq tokenize build/tests/data/exl3-model/exl3-3.0bpw\n"
          "  echo 42 375 341 | sparq tokenize MODEL --text\n"
          "  echo '[{\"role\":\"user\",\"content\":\"Hi\"}]' | sparq tokenize MODEL --chat --render\n"};

static int read_all(FILE *f, char **out, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = sparq_malloc(cap);
    if (!buf) return -1;
    for (;;) {
        if (len + 1 >= cap) {
            char *p = sparq_realloc(buf, cap * 2);
            if (!p) {
                sparq_free(buf);
                return -1;
            }
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        sparq_free(buf);
        return -1;
    }
    buf[len] = 0;
    *out = buf;
    *n = len;
    return 0;
}

/* --chat: parse the JSON message list and apply the template. */
static int render_chat(const sq_tokenizer *tok, const char *json, size_t n, bool gen, char **out)
{
    json_error_t jerr;
    json_t *root = json_loadb(json, n, 0, &jerr);
    if (!json_is_array(root) || json_array_size(root) > 4096) {
        fprintf(stderr, "sparq tokenize: --chat input must be a JSON array of messages (%s)\n",
                root ? "not an array, or too long" : jerr.text);
        json_decref(root);
        return 1;
    }
    size_t nm = json_array_size(root);
    sq_chat_msg *m = sparq_calloc(nm ? nm : 1, sizeof *m);
    int ret = m ? 0 : 1;
    for (size_t i = 0; i < nm && ret == 0; i++) {
        const json_t *e = json_array_get(root, i);
        const char *role = json_string_value(json_object_get(e, "role"));
        const char *content = json_string_value(json_object_get(e, "content"));
        if (!role || !content) {
            fprintf(stderr, "sparq tokenize: message %zu needs string \"role\" and \"content\"\n", i);
            ret = 1;
        } else if (!strcmp(role, "system")) m[i].role = SQ_ROLE_SYSTEM;
        else if (!strcmp(role, "user")) m[i].role = SQ_ROLE_USER;
        else if (!strcmp(role, "assistant")) m[i].role = SQ_ROLE_ASSISTANT;
        else {
            fprintf(stderr, "sparq tokenize: message %zu: role \"%s\" is not system, user or assistant\n", i, role);
            ret = 1;
        }
        m[i].content = content;
    }
    if (ret == 0) {
        sparq_status st = sq_chat_apply(tok, m, (int)nm, gen, out);
        if (st != SPARQ_OK) ret = cli_fail(&spec, st);
    }
    sparq_free(m);
    json_decref(root);
    return ret;
}

int cmd_tokenize(int argc, char **argv)
{
    cli_args a;
    const char *v;
    int id;
    bool to_text = false, special = false, skip_special = false, info = false, chat = false, render = false,
         gen_prompt = true;
    const char *file = NULL;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        switch (id) {
        case 0: to_text = false; break;
        case 1: to_text = true; break;
        case 2: special = true; break;
        case 3: skip_special = true; break;
        case 4: file = v; break;
        case 5: info = true; break;
        case 6: chat = true; break;
        case 7: render = true; break;
        case 8: gen_prompt = false; break;
        }
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expected one MODEL argument (see --help)");
    if (chat && to_text) return cli_usage_error(&spec, "--chat and --text do not go together");
    if ((render || !gen_prompt) && !chat)
        return cli_usage_error(&spec, "--render and --no-generation-prompt need --chat");

    sq_tokenizer *tok;
    sparq_status st = sq_tokenizer_load(&tok, a.pos[0]);
    if (st != SPARQ_OK) return cli_fail(&spec, st);
    if (info) {
        printf("vocab_size %d\neos %d\nbos %d\npad %d\nadd_bos %s\nchat %s\n", sq_tokenizer_vocab_size(tok),
               sq_tokenizer_eos(tok), sq_tokenizer_bos(tok), sq_tokenizer_pad(tok),
               sq_tokenizer_add_bos(tok) ? "yes" : "no", sq_chat_family_name(sq_tokenizer_chat_family(tok)));
        sq_tokenizer_free(tok);
        return 0;
    }
    FILE *in = stdin;
    if (file && !(in = fopen(file, "rb"))) {
        fprintf(stderr, "sparq tokenize: %s: %s\n", file, strerror(errno));
        sq_tokenizer_free(tok);
        return 1;
    }
    char *buf = NULL;
    size_t n = 0;
    int rc = read_all(in, &buf, &n);
    if (in != stdin) fclose(in);
    if (rc) {
        fprintf(stderr, "sparq tokenize: cannot read the input\n");
        sq_tokenizer_free(tok);
        return 1;
    }
    int ret = 0;
    if (chat) {
        /* render the messages, then fall through to encoding the prompt */
        char *prompt = NULL;
        ret = render_chat(tok, buf, n, gen_prompt, &prompt);
        sparq_free(buf);
        buf = prompt;
        n = prompt ? strlen(prompt) : 0;
        special = true;
        if (ret == 0 && render) {
            fwrite(buf, 1, n, stdout);
            sparq_free(buf);
            sq_tokenizer_free(tok);
            return 0;
        }
    }
    if (ret == 0 && !to_text) {
        int32_t *ids;
        size_t nid;
        st = sq_tokenizer_encode(tok, buf, n, special, &ids, &nid);
        if (st != SPARQ_OK) ret = cli_fail(&spec, st);
        else {
            for (size_t i = 0; i < nid; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
            sparq_free(ids);
        }
    } else if (ret == 0) {
        size_t cap = 1024, nid = 0;
        int32_t *ids = sparq_malloc(cap * sizeof *ids);
        char *p = buf, *end;
        while (ids && ret == 0) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
            if (!*p) break;
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno || x < 0 || x > INT32_MAX) {
                fprintf(stderr, "sparq tokenize: input is not a list of token ids near \"%.20s\"\n", p);
                ret = 1;
                break;
            }
            if (nid == cap) {
                int32_t *q = sparq_realloc(ids, 2 * cap * sizeof *ids);
                if (!q) break;
                ids = q;
                cap *= 2;
            }
            ids[nid++] = (int32_t)x;
            p = end;
        }
        if (!ids) ret = 1;
        if (ret == 0) {
            char *text;
            size_t tl;
            st = sq_tokenizer_decode(tok, ids, nid, skip_special, &text, &tl);
            if (st != SPARQ_OK) ret = cli_fail(&spec, st);
            else {
                fwrite(text, 1, tl, stdout);
                sparq_free(text);
            }
        }
        sparq_free(ids);
    }
    sparq_free(buf);
    sq_tokenizer_free(tok);
    return ret;
}
