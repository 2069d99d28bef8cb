/**
 * The container's uid, gid and supplementary groups, resolved against the image's own
 * /etc/passwd and /etc/group (the host's files mean nothing inside the container). Pure.
 */
import type { OciContainerSecurityInput, OciImageInput } from './input.js';
import { fieldError } from './process.js';
import type { OciUser } from './spec-types.js';

/** The largest id Linux accepts ((uid_t)-1 is reserved as "no change"). */
const MAX_ID = 4294967294;

export interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

export interface GroupEntry {
  name: string;
  gid: number;
  members: string[];
}

function parseId(text: string): number | undefined {
  if (!/^\d{1,10}$/.test(text)) return undefined;
  const n = Number(text);
  return n <= MAX_ID ? n : undefined;
}

/** Entries of an /etc/passwd text; blank, comment and malformed lines are skipped as libc does. */
export function parsePasswd(text: string | undefined): PasswdEntry[] {
  const out: PasswdEntry[] = [];
  for (const line of (text ?? '').split('\n')) {
    const f = line.split(':');
    if (f.length < 7 || line.startsWith('#')) continue;
    const uid = parseId(f[2]!);
    const gid = parseId(f[3]!);
    if (f[0] === '' || uid === undefined || gid === undefined) continue;
    out.push({ name: f[0]!, uid, gid, home: f[5]! });
  }
  return out;
}

/** Entries of an /etc/group text; blank, comment and malformed lines are skipped. */
export function parseGroup(text: string | undefined): GroupEntry[] {
  const out: GroupEntry[] = [];
  for (const line of (text ?? '').split('\n')) {
    const f = line.split(':');
    if (f.length < 4 || line.startsWith('#')) continue;
    const gid = parseId(f[2]!);
    if (f[0] === '' || gid === undefined) continue;
    out.push({ name: f[0]!, gid, members: f[3]!.split(',').filter((m) => m !== '') });
  }
  return out;
}

export interface ResolvedUser {
  user: OciUser;
  /** The home directory from passwd, `/` when the user has no entry. */
  home: string;
}

function idOf(text: string, field: string): number {
  const id = parseId(text);
  if (id === undefined) throw fieldError('OCI_ID_INVALID', field, `is "${text}", not an id between 0 and ${MAX_ID}`);
  return id;
}

/**
 * Who runs the container. The user comes from run_as_user, else run_as_username, else the image's
 * User (`name`, `uid`, `name:group`, `uid:gid`); a name must exist in the image's passwd, a number
 * need not (its primary gid is then 0). The group comes from run_as_group, else the `:group` part
 * of the image's User, else the passwd entry. Supplementary groups: the primary gid, then (policy
 * Merge, the default) every /etc/group entry listing the user, then supplemental_groups, without
 * repeats; policy Strict keeps only the primary gid and supplemental_groups.
 */
export function resolveUser(
  security: OciContainerSecurityInput | null | undefined,
  image: OciImageInput | null | undefined,
  passwdText: string | undefined,
  groupText: string | undefined,
): ResolvedUser {
  const passwd = parsePasswd(passwdText);
  const groups = parseGroup(groupText);
  const runAsUser = security?.run_as_user ?? null;
  const runAsGroup = security?.run_as_group ?? null;
  const runAsUsername = security?.run_as_username ?? '';
  if (runAsGroup !== null && runAsUser === null && runAsUsername === '') {
    throw fieldError(
      'OCI_RUN_AS_GROUP_WITHOUT_USER',
      'container.linux.security_context.run_as_group',
      'is set without run_as_user or run_as_username',
    );
  }

  let userPart: string;
  let groupPart = '';
  let userField: string;
  if (runAsUser !== null) {
    userPart = runAsUser.value;
    userField = 'container.linux.security_context.run_as_user';
    idOf(userPart, userField);
  } else if (runAsUsername !== '') {
    userPart = runAsUsername;
    userField = 'container.linux.security_context.run_as_username';
  } else {
    const spec = image?.User ?? '';
    const colon = spec.indexOf(':');
    userPart = colon < 0 ? spec : spec.slice(0, colon);
    groupPart = colon < 0 ? '' : spec.slice(colon + 1);
    userField = 'image.User';
  }

  let entry: PasswdEntry | undefined;
  let uid: number;
  if (userPart === '') {
    uid = 0;
    entry = passwd.find((p) => p.uid === 0);
  } else if (/^\d+$/.test(userPart)) {
    uid = idOf(userPart, userField);
    entry = passwd.find((p) => p.uid === uid);
  } else {
    entry = passwd.find((p) => p.name === userPart);
    if (entry === undefined)
      throw fieldError('OCI_USER_UNKNOWN', userField, `names user "${userPart}", which the image's /etc/passwd does not have`);
    uid = entry.uid;
  }

  let gid = entry?.gid ?? 0;
  if (runAsGroup !== null) {
    gid = idOf(runAsGroup.value, 'container.linux.security_context.run_as_group');
  } else if (groupPart !== '') {
    if (/^\d+$/.test(groupPart)) gid = idOf(groupPart, userField);
    else {
      const g = groups.find((e) => e.name === groupPart);
      if (g === undefined)
        throw fieldError('OCI_GROUP_UNKNOWN', userField, `names group "${groupPart}", which the image's /etc/group does not have`);
      gid = g.gid;
    }
  }

  const additional = [gid];
  const strict = security?.supplemental_groups_policy === 'Strict';
  if (!strict && entry !== undefined) {
    for (const g of groups) if (g.members.includes(entry.name)) additional.push(g.gid);
  }
  (security?.supplemental_groups ?? []).forEach((text, i) => {
    additional.push(idOf(text, `container.linux.security_context.supplemental_groups[${i}]`));
  });
  return { user: { uid, gid, additionalGids: [...new Set(additional)] }, home: entry?.home || '/' };
}
