package childproc_test

import (
	"fmt"
	"os/exec"
	"testing"

	"github.com/dlock-go/dlock/internal/childproc"
)

// The child gets the environment and the pipes, and is gone once the test
// that started it ended, though it would have read stdin for ever.
func TestStartAndEnd(t *testing.T) {
	var cmd *exec.Cmd
	t.Run("child", func(t *testing.T) {
		cmd = exec.Command("sh", "-c", `echo "$CHILDPROC_X"; exec cat`)
		stdin, out := childproc.Start(t, cmd, cmd, "CHILDPROC_X=x1")
		if !out.Scan() || out.Text() != "x1" {
			t.Fatalf("child said %q (%v), want its environment's x1", out.Text(), out.Err())
		}
		if _, err := fmt.Fprintln(stdin, "echo"); err != nil {
			t.Fatal(err)
		}
		if !out.Scan() || out.Text() != "echo" {
			t.Fatalf("child said %q (%v), want the line it read back", out.Text(), out.Err())
		}
	})
	if cmd.ProcessState == nil {
		t.Fatal("the child was not waited for when its test ended")
	}
	if cmd.ProcessState.Success() {
		t.Fatalf("the child ended by itself (%v), not killed", cmd.ProcessState)
	}
}
