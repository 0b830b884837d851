// Command dlock is the command-line tool of the dlock distributed-lock
// library.
//
// Usage:
//
//	dlock <command> [flags] [args]
//	dlock --version
//
// Each command lives in its own file and registers itself in init; see
// "dlock help" for the list. Exit codes shared by all commands:
//
//	0   success
//	1   the command ran and failed (for market: a conservation check failed)
//	64  usage error (EX_USAGE): bad flags or arguments, one line on stderr
//	69  service unavailable (EX_UNAVAILABLE): Redis cannot be reached or started
//	130 interrupted (SIGINT, SIGTERM or SIGHUP)
//
// dlock run, interrupted by SIGINT, SIGTERM or SIGHUP, ends killed by the
// same signal (a shell reports 128+N).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Exit codes; see the package documentation.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 64
	exitUnavailable = 69
	exitInterrupted = 130
)

// command is one subcommand.
type command struct {
	name    string
	summary string // one line for "dlock help"
	// run executes the command with the arguments after its name and
	// returns the exit code. ctx ends on SIGINT, SIGTERM or SIGHUP.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands holds every registered subcommand, by name.
var commands = map[string]command{}

// register adds c; each command's file calls it from init.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("dlock: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func main() {
	startIgnored = map[syscall.Signal]bool{
		syscall.SIGINT: signal.Ignored(syscall.SIGINT),
		syscall.SIGHUP: signal.Ignored(syscall.SIGHUP),
	}
	// SIGHUP too (the terminal went away): by default it would end dlock
	// without its deferred clean-up, leaving e.g. market's private server's
	// directory behind.
	ctx, stop := signal.NotifyContext(context.Background(), notIgnored(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)...)
	// After the first signal, restore the default handling so that a
	// second one kills the process at once.
	go func() { <-ctx.Done(); stop() }()
	// go-redis logs every failed dial on its own; commands report errors
	// in one line instead.
	redis.SetLogger(quietLogger{})
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if dieSignal != 0 && !startIgnored[dieSignal] {
		raise(dieSignal, dieWithGroup)
	}
	os.Exit(code)
}

// startIgnored holds SIGINT and SIGHUP if dlock was started with them
// ignored, as a shell starts a script's background jobs (SIGINT) and nohup
// its command (SIGHUP). dlock leaves them ignored: it neither catches
// them nor ends by them, and dlock run's COMMAND starts with them ignored
// too, as it would without dlock.
var startIgnored map[syscall.Signal]bool

// notIgnored returns sigs without those dlock was started ignoring. sigs
// must hold one that cannot be (SIGTERM): signal.Notify with no signal
// would catch them all.
func notIgnored(sigs ...os.Signal) []os.Signal {
	var out []os.Signal
	for _, s := range sigs {
		if ss, ok := s.(syscall.Signal); !ok || !startIgnored[ss] {
			out = append(out, s)
		}
	}
	return out
}

// dieSignal, when a command sets it (through dieOf), makes dlock end
// killed by that signal once the command has returned and cleaned up,
// instead of exiting with the command's code. With dieWithGroup, the
// signal goes to dlock's whole process group (see superviseRun).
var (
	dieSignal    syscall.Signal
	dieWithGroup bool
)

// dieOf asks for dlock to end killed by s, so that its caller sees it end
// the way it was asked to (a shell leaves a loop only for a child killed by
// SIGINT), and returns the exit code to use if s cannot be raised: 128+N,
// or code for a signal that is not a syscall.Signal.
func dieOf(s os.Signal, code int) int {
	if ss, ok := s.(syscall.Signal); ok {
		dieSignal = ss
		return 128 + int(ss)
	}
	return code
}

// dispatch runs the command named by args[0].
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	case "version", "-version", "--version":
		writeVersion(stdout)
		return exitOK
	case guardCommand:
		return runGuard(args[1:], stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "dlock: unknown command %q (commands: %s; see dlock help)\n", args[0], strings.Join(commandNames(), ", "))
		return exitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "dlock: distributed locks on Redis\n\nUsage:\n  dlock <command> [flags] [args]\n\nCommands:\n")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun \"dlock <command> -h\" for a command's flags and examples, \"dlock --version\"\nfor the version and commit of this build.\n")
}

// quietLogger discards go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
