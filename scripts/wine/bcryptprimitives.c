/* bcryptprimitives.dll for Wine 8 test prefixes.
 *
 * Rust's std (1.78 and later) on x86_64-pc-windows-gnu gets its random bytes from
 * ProcessPrng in bcryptprimitives.dll, which Windows 10+ has and Wine 8.0 (Debian 12's) does
 * not: every test binary would stop with "bcryptprimitives.dll not found". This DLL exports
 * ProcessPrng on top of RtlGenRandom (advapi32's SystemFunction036), which Wine implements.
 * scripts/test-windows.sh builds it into the test prefix only; it never ships.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
