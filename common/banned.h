/* banned.h: included last by common.h, after the system headers. It
 * turns calls to functions with no safe use into compile errors, as git does.
 */
#ifndef CRUN_BANNED_H
#define CRUN_BANNED_H

#define BANNED(func) sorry_##func##_is_banned_in_crun

#undef strcpy
#define strcpy(x, y) BANNED(strcpy)
#undef strcat
#define strcat(x, y) BANNED(strcat)
#undef sprintf
#define sprintf(...) BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) BANNED(vsprintf)
#undef strtok
#define strtok(x, y) BANNED(strtok)
#undef atoi
#define atoi(x) BANNED(atoi)
#undef gets
#define gets(x) BANNED(gets)
#undef asctime
#define asctime(x) BANNED(asctime)
#undef ctime
#define ctime(x) BANNED(ctime)

#endif
