/* A stand-in for the nonewprivs e2e test image: installed setuid root, it prints the effective uid it runs
 * with (0 when the setuid bit took effect, the caller's uid under no_new_privs). */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
    printf("Effective uid: %d\n", (int)geteuid());
    return 0;
}
