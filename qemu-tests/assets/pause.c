/* kiln boot tests: a stand-in for Kubernetes' pause container (its sandbox image), built
   by cri-images.sh because no registry is reachable from the test guests. Like the real
   one it only holds the pod's namespaces open: it sleeps until SIGINT/SIGTERM and, as the
   pod's PID 1, reaps any child that exits. Written for kiln; not upstream's source. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction s = {0};
  s.sa_handler = stop;
  sigaction(SIGINT, &s, NULL);
  sigaction(SIGTERM, &s, NULL);
  s.sa_handler = reap;
  s.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &s, NULL);
  for (;;) pause();
}
