import { describe, expect, it } from 'vitest';
import { parseGroup, parsePasswd, resolveUser } from '../../../src/oci/user.js';
import { thrown } from './load.js';

const passwd = [
  'root:x:0:0:root:/root:/bin/sh',
  '# comment',
  'app:x:1000:1000:App:/home/app:/bin/sh',
  'svc:x:2000:2500::/srv:/bin/false',
  'bad:x:notanumber:1:::',
  '',
].join('\n');
const group = ['root:x:0:', 'app:x:1000:', 'svcgrp:x:2500:', 'audio:x:29:app,svc', 'video:x:44:app', 'staff:x:50:root'].join('\n');

const sc = (s: object) => s;

describe('passwd and group parsing', () => {
  it('skips comments and malformed lines', () => {
    expect(parsePasswd(passwd).map((p) => p.name)).toEqual(['root', 'app', 'svc']);
    expect(parseGroup(group).find((g) => g.name === 'audio')?.members).toEqual(['app', 'svc']);
    expect(parsePasswd(undefined)).toEqual([]);
  });
});

describe('resolveUser', () => {
  it('no user anywhere: root, with root memberships', () => {
    expect(resolveUser(null, null, passwd, group)).toEqual({ user: { uid: 0, gid: 0, additionalGids: [0, 50] }, home: '/root' });
  });
  it('image User as a name takes uid, gid and memberships from the image files', () => {
    expect(resolveUser(null, { User: 'app' }, passwd, group).user).toEqual({ uid: 1000, gid: 1000, additionalGids: [1000, 29, 44] });
  });
  it('image User as uid:gid needs no passwd entry', () => {
    expect(resolveUser(null, { User: '4242:4343' }, passwd, group)).toEqual({
      user: { uid: 4242, gid: 4343, additionalGids: [4343] },
      home: '/',
    });
  });
  it('image User as name:group and uid:group', () => {
    expect(resolveUser(null, { User: 'svc:audio' }, passwd, group).user).toEqual({ uid: 2000, gid: 29, additionalGids: [29] });
    expect(resolveUser(null, { User: '1000:video' }, passwd, group).user.gid).toBe(44);
  });
  it('a numeric user without an entry gets gid 0', () => {
    expect(resolveUser(null, { User: '777' }, passwd, undefined).user).toEqual({ uid: 777, gid: 0, additionalGids: [0] });
  });
  it('run_as_user overrides the image, its passwd entry gives the gid', () => {
    expect(resolveUser(sc({ run_as_user: { value: '2000' } }), { User: 'app' }, passwd, group).user).toEqual({
      uid: 2000,
      gid: 2500,
      additionalGids: [2500, 29],
    });
  });
  it('run_as_username and run_as_group', () => {
    expect(resolveUser(sc({ run_as_username: 'app', run_as_group: { value: '5' } }), null, passwd, group).user).toEqual({
      uid: 1000,
      gid: 5,
      additionalGids: [5, 29, 44],
    });
  });
  it('supplemental groups: Merge adds memberships, Strict only the listed ones, no repeats', () => {
    const merge = sc({ run_as_user: { value: '1000' }, supplemental_groups: ['44', '3000'] });
    expect(resolveUser(merge, null, passwd, group).user.additionalGids).toEqual([1000, 29, 44, 3000]);
    const strict = sc({ run_as_user: { value: '1000' }, supplemental_groups: ['3000'], supplemental_groups_policy: 'Strict' });
    expect(resolveUser(strict, null, passwd, group).user.additionalGids).toEqual([1000, 3000]);
  });
  it('run_as_group without a user is refused (a conformance bug the issue names)', () => {
    const err = thrown(() => resolveUser(sc({ run_as_group: { value: '10' } }), null, passwd, group));
    expect(err.reason).toBe('OCI_RUN_AS_GROUP_WITHOUT_USER');
    expect(err.message).toMatch(/^container\.linux\.security_context\.run_as_group /);
  });
  it('unknown names and bad ids are refused naming the field', () => {
    expect(thrown(() => resolveUser(null, { User: 'ghost' }, passwd, group)).reason).toBe('OCI_USER_UNKNOWN');
    expect(thrown(() => resolveUser(null, { User: 'app:ghosts' }, passwd, group)).reason).toBe('OCI_GROUP_UNKNOWN');
    expect(thrown(() => resolveUser(sc({ run_as_username: 'ghost' }), null, passwd, group)).message).toMatch(/run_as_username/);
    expect(thrown(() => resolveUser(sc({ run_as_user: { value: '-1' } }), null, passwd, group)).reason).toBe('OCI_ID_INVALID');
    expect(thrown(() => resolveUser(sc({ run_as_user: { value: '4294967295' } }), null, passwd, group)).reason).toBe('OCI_ID_INVALID');
    const err = thrown(() => resolveUser(sc({ run_as_user: { value: '1' }, supplemental_groups: ['x'] }), null, passwd, group));
    expect(err.message).toMatch(/supplemental_groups\[0\]/);
  });
  it('a user name with no image passwd at all is refused', () => {
    expect(thrown(() => resolveUser(null, { User: 'app' }, undefined, undefined)).reason).toBe('OCI_USER_UNKNOWN');
  });
});
