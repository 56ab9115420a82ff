// The owner's web page: its own text, in English and Chinese (the server's language).
export const TEXTS = {
  en: {
    login: 'Log in', token: 'Owner token', tokenHint: 'The owner token: DATA/token, or the link sessionloop serve printed.',
    wrongToken: 'That token was not accepted.', logout: 'Log out', newSession: 'New session', search: 'Search sessions',
    mine: 'Mine', rooms: 'Rooms', archived: 'Archived', showArchived: 'Archived', showActive: 'Active',
    running: 'running', error: 'error', attention: 'needs you', unread: 'unread', background: 'background {0}',
    tokens: '{0} tokens', children: '{0} child sessions', archive: 'Archive', unarchive: 'Unarchive', delete: 'Delete',
    confirmDelete: 'Delete "{0}" and every session below it?', noSessions: 'No sessions', pick: 'Pick a session or make a new one.',
    send: 'Send', attach: 'Attach', abort: 'Stop', compress: 'Compress', clearPlan: 'Clear plan', stopAll: 'Stop all background',
    input: 'Message', older: 'Older messages', reasoning: 'Reasoning', rewindCode: 'Rewind code', rewindAll: 'Rewind code and chat',
    continue: 'Continue', approve: 'Approve', deny: 'Deny', note: 'Note (sent to the model when you deny)',
    expiresIn: 'expires in {0} s', approvalFor: 'Approval: {0}', inSession: 'in {0}', tasks: 'Background tasks',
    stop: 'Stop', output: 'Output', exitCode: 'exit {0}', queue: 'Waiting: {0}', disconnected: 'Disconnected: reconnecting…',
    turnRunning: 'turn running', replied: 'replied', silent: 'silent', aborted: 'aborted', failed: 'failed',
    plan: 'Plan', usage: 'context {0} tokens ({1}%)', context: 'context {0} tokens', rename: 'Rename',
    grant: 'Answer later calls of this tool the same way', grantNone: 'only this call', grantTurn: 'for the rest of this turn',
    grantSession: 'for this session (24 h)', backgroundTask: 'background task {0}', notExecuted: 'not executed',
    settled: '{0} ({1})', attachments: '{0} attachment(s)', children_: 'Child sessions', rewound: 'Rewound: {0} restored, {1} removed',
    speaker: '{0}',
    settings: 'Settings', writeTo: 'Write to', inherit: '(not set here)', notSet: 'not set on any layer',
    fromDefault: 'from the default', from: 'from {0}', reset: 'Reset', save: 'Save',
  },
  zh: {
    login: '登录', token: 'owner 令牌', tokenHint: 'owner 令牌:DATA/token,或 sessionloop serve 打印的链接。',
    wrongToken: '令牌不对。', logout: '退出', newSession: '新会话', search: '搜索会话',
    mine: '我的', rooms: '房间', archived: '已归档', showArchived: '已归档', showActive: '未归档',
    running: '运行中', error: '出错', attention: '需要我处理', unread: '未读', background: '后台 {0}',
    tokens: '{0} token', children: '{0} 个子会话', archive: '归档', unarchive: '取消归档', delete: '删除',
    confirmDelete: '删除「{0}」及其下所有会话?', noSessions: '没有会话', pick: '选一个会话,或新建一个。',
    send: '发送', attach: '附件', abort: '停止', compress: '压缩', clearPlan: '清空计划', stopAll: '停止全部后台工作',
    input: '消息', older: '更早的消息', reasoning: '思考', rewindCode: '回滚代码', rewindAll: '回滚代码与对话',
    continue: '继续', approve: '批准', deny: '拒绝', note: '说明(拒绝时回给模型)',
    expiresIn: '{0} 秒后到期', approvalFor: '审批:{0}', inSession: '在 {0}', tasks: '后台任务',
    stop: '停止', output: '输出', exitCode: '退出码 {0}', queue: '排队中:{0}', disconnected: '连接断开,正在重连…',
    turnRunning: '回合进行中', replied: '已回复', silent: '静默', aborted: '已中止', failed: '出错',
    plan: '计划', usage: '上下文 {0} token({1}%)', context: '上下文 {0} token', rename: '改名',
    grant: '之后同一工具的调用按同样处理', grantNone: '只这一次', grantTurn: '本回合余下的调用',
    grantSession: '本会话(24 小时)', backgroundTask: '后台任务 {0}', notExecuted: '没有执行',
    settled: '{0}({1})', attachments: '{0} 个附件', children_: '子会话', rewound: '已回滚:恢复 {0} 个,删除 {1} 个',
    speaker: '{0}',
    settings: '设置', writeTo: '写到', inherit: '(此处未设置)', notSet: '各层都未设置',
    fromDefault: '来自默认值', from: '来自 {0}', reset: '清除', save: '保存',
  },
};
let TX = TEXTS.en;
export function setLanguage(language) {
  TX = TEXTS[language] || TEXTS.en;
}

export function t(key, ...args) {
  let s = TX[key] ?? TEXTS.en[key] ?? key;
  args.forEach((v, i) => { s = s.replace('{' + i + '}', String(v)); });
  return s;
}
