/* cli/commands.h — the subcommand table. Each command lives in its own
 * cli/cmd_<name>.c and is listed once here. */
#ifndef SPARQ_CLI_COMMANDS_H
#define SPARQ_CLI_COMMANDS_H

typedef int (*cli_cmd_fn)(int argc, char **argv);

typedef struct cli_command {
    const char *name;
    const char *summary;
    cli_cmd_fn fn;
} cli_command;

/* One declaration per command (argv[0] is the command name). */
int cmd_version(int argc, char **argv);
/* @commands-decl: helpers add their declarations below this line */
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_inspect(int argc, char **argv);

#endif
