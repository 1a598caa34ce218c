/* _dl_find_object for static musl binaries.
 *
 * Debian's libgcc_eh.a (gcc 12, built against glibc >= 2.35) finds unwind tables through
 * glibc's _dl_find_object, which musl lacks. scripts/build-firstboot.sh links this file into
 * the libunwind.a that Rust's musl std asks for, so a panic's backtrace (RUST_BACKTRACE=1)
 * still works in the static kiln-firstboot. The lookup walks the loaded objects with
 * dl_iterate_phdr, which musl provides for static executables too.
 */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* libgcc_eh calls these through weak references, and a weak reference does not pull a member
 * out of libc.a: without these strong ones, _Unwind_Backtrace jumps to address 0. */
void *const kiln_unwind_keep_pthread[] = {
    (void *)pthread_once, (void *)pthread_mutex_lock, (void *)pthread_mutex_unlock,
    (void *)pthread_key_create, (void *)pthread_getspecific, (void *)pthread_setspecific,
};

/* glibc's x86-64 layout (dlfcn.h): no eh_dbase member on this architecture. */
struct dl_find_object {
    unsigned long long dlfo_flags;
    void *dlfo_map_start;
    void *dlfo_map_end;
    void *dlfo_link_map;
    void *dlfo_eh_frame;
    unsigned long long dlfo_reserved[7];
};

struct lookup {
    uintptr_t pc;
    struct dl_find_object *out;
};

static int visit(struct dl_phdr_info *info, size_t size, void *data)
{
    struct lookup *l = data;
    uintptr_t lo = UINTPTR_MAX, hi = 0, eh = 0;
    int hit = 0;
    (void)size;
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD) {
            uintptr_t end = start + ph->p_memsz;
            if (start < lo) lo = start;
            if (end > hi) hi = end;
            if (l->pc >= start && l->pc < end) hit = 1;
        } else if (ph->p_type == PT_GNU_EH_FRAME) {
            eh = start;
        }
    }
    if (!hit) return 0;
    l->out->dlfo_flags = 0;
    l->out->dlfo_map_start = (void *)lo;
    l->out->dlfo_map_end = (void *)hi;
    l->out->dlfo_link_map = NULL;
    l->out->dlfo_eh_frame = (void *)eh;
    return 1;
}

int _dl_find_object(void *pc, struct dl_find_object *result)
{
    struct lookup l = { (uintptr_t)pc, result };
    return dl_iterate_phdr(visit, &l) ? 0 : -1;
}
